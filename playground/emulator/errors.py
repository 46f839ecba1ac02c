"""Failure Status bodies shaped exactly as kube-apiserver sends them."""

REASON_BY_CODE = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """Raised anywhere in request handling; the server turns it into a Status response."""

    def __init__(self, code, message, reason=None, details=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASON_BY_CODE.get(code, "Unknown")
        self.details = details

    def status(self):
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason}
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(rt, name):
    details = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    return details


def not_found(rt, name):
    return ApiError(404, f'{rt.qualified_name} "{name}" not found', "NotFound", _details(rt, name))


def already_exists(rt, name):
    return ApiError(409, f'{rt.qualified_name} "{name}" already exists', "AlreadyExists",
                    _details(rt, name))


def conflict(rt, name):
    return ApiError(409, f'Operation cannot be fulfilled on {rt.qualified_name} "{name}": the '
                         "object has been modified; please apply your changes to the latest "
                         "version and try again", "Conflict", _details(rt, name))


def bad_request(message):
    return ApiError(400, message, "BadRequest")


def expired(message):
    return ApiError(410, message, "Expired")


class FieldError:
    """One validation failure; rendered like k8s.io/apimachinery field.Error."""

    def __init__(self, field, kind, detail="", value=None, has_value=False):
        self.field = field
        self.kind = kind  # "Invalid", "Required", "Forbidden", "TooMany", "Duplicate", ...
        self.detail = detail
        self.value = value
        self.has_value = has_value

    REASONS = {"Invalid": "FieldValueInvalid", "Required": "FieldValueRequired",
               "Forbidden": "FieldValueForbidden", "TooMany": "FieldValueTooMany",
               "Duplicate": "FieldValueDuplicate", "Unsupported": "FieldValueNotSupported",
               "TypeInvalid": "FieldValueTypeInvalid", "Unknown": "FieldValueInvalid"}
    LABELS = {"Invalid": "Invalid value", "Required": "Required value",
              "Forbidden": "Forbidden", "TooMany": "Too many", "Duplicate": "Duplicate value",
              "Unsupported": "Unsupported value", "TypeInvalid": "Invalid value",
              "Unknown": "Unknown field"}

    def message(self):
        text = self.LABELS[self.kind]
        if self.has_value:
            value = f'"{self.value}"' if isinstance(self.value, str) else repr(self.value)
            text += f": {value}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self):
        return f"{self.field}: {self.message()}"


def invalid(rt, kind, name, field_errors):
    """422 Invalid listing every field error, as the real server does."""
    if len(field_errors) == 1:
        summary = str(field_errors[0])
    else:
        summary = "[" + ", ".join(str(e) for e in field_errors) + "]"
    qualified_kind = f"{kind}.{rt.group}" if rt.group else kind
    details = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = kind
    details["causes"] = [{"reason": FieldError.REASONS[e.kind], "message": e.message(),
                          "field": e.field} for e in field_errors]
    return ApiError(422, f'{qualified_kind} "{name}" is invalid: {summary}', "Invalid", details)
