"""labelSelector and fieldSelector parsing and matching (the subset kube-apiserver accepts)."""

import re

from .errors import bad_request

_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")
_EQ_TERM = re.compile(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$")


def _split_top_level(text):
    """Split on commas that are not inside parentheses: 'a in (x,y),b' -> ['a in (x,y)', 'b']."""
    terms, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


class LabelSelector:
    def __init__(self, text):
        self.requirements = [self._parse_term(t) for t in _split_top_level(text or "")]

    @staticmethod
    def _parse_term(term):
        match = _SET_TERM.match(term)
        if match:
            key, op, values = match.groups()
            return key, op, {v.strip() for v in values.split(",") if v.strip()}
        match = _EQ_TERM.match(term)
        if match:
            key, op, value = match.groups()
            return key.strip(), "!=" if op == "!=" else "=", value.strip()
        if term.startswith("!"):
            return term[1:].strip(), "!exists", None
        if re.fullmatch(r"[A-Za-z0-9._/-]+", term):
            return term, "exists", None
        raise bad_request(f"unable to parse requirement: {term!r}")

    def matches(self, labels):
        labels = labels or {}
        for key, op, value in self.requirements:
            present = key in labels
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and present and labels[key] == value:
                return False
            if op == "in" and labels.get(key) not in value:
                return False
            if op == "notin" and present and labels[key] in value:
                return False
            if op == "exists" and not present:
                return False
            if op == "!exists" and present:
                return False
        return True


def field_value(obj, path):
    """The string form of a dotted field path, as the real server's field sets render it."""
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):  # e.g. Event "source": the real server selects on source.component
        return value.get("component", "")
    return str(value)


class FieldSelector:
    def __init__(self, text, resource_type):
        self.requirements = []
        for term in _split_top_level(text or ""):
            match = _EQ_TERM.match(term)
            if not match:
                raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
            path, op, value = (g.strip() for g in match.groups())
            if path not in resource_type.field_selectors:
                raise bad_request(f'field label not supported: {path}')
            self.requirements.append((path, op == "!=", value))

    def matches(self, obj):
        for path, negate, value in self.requirements:
            if (field_value(obj, path) == value) == negate:
                return False
        return True


class Selection:
    """Label and field selectors of one list or watch request."""

    def __init__(self, resource_type, label_selector="", field_selector=""):
        self.labels = LabelSelector(label_selector)
        self.fields = FieldSelector(field_selector, resource_type)

    def matches(self, obj):
        if obj is None:
            return False
        return self.labels.matches(obj["metadata"].get("labels")) and self.fields.matches(obj)
