"""The README's flag table says what `gpushare-dra kubelet-plugin --help` says."""

import re
from pathlib import Path

from dra_driver.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
# Cells that describe a default in words rather than as a value (the flag reads the environment,
# or the default is computed at start-up).
# --mock-gpus: unset means 1x16Gi, decided where the mock backend starts.
DESCRIBED = {"--node-name", "--kubeconfig", "--plugin-dir", "--hook-dir", "--mock-gpus"}


def _readme_rows() -> dict[str, str]:
    text = README.read_text()
    table = text[text.index("### `gpushare-dra kubelet-plugin`"):text.index("### Command-line errors")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`--"):
            for flag in re.findall(r"`(--[\w-]+)`", cells[0]):
                rows[flag] = cells[1]
    return rows


def _plugin_defaults() -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    plugin = sub.choices["kubelet-plugin"]
    return {opt: a.default for a in plugin._actions for opt in a.option_strings if opt.startswith("--")}


def _as_readme(value: object) -> set[str]:
    """The ways the README writes a default value."""
    if value is True:
        return {"on"}
    if value is False:
        return {"off"}
    if value == "":
        return {"empty"}
    if value is None:
        return {"unset"}
    if isinstance(value, list):
        value = " ".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return {f"`{int(value)}`", f"`{value}`"}
    return {f"`{value}`"}


def test_every_plugin_flag_is_in_the_readme_table():
    flags = {f for f in _plugin_defaults() if not f.startswith("--no-")}  # --no-X: the off side of --X
    missing = flags - set(_readme_rows()) - {"--help"}
    assert not missing


def test_the_readme_defaults_match_the_parser():
    rows, defaults = _readme_rows(), _plugin_defaults()
    wrong = {}
    for flag, cell in rows.items():
        if flag in DESCRIBED or flag not in defaults:
            continue
        shown = cell.split(",")[0].strip() if flag == "--log-level" else cell
        if flag == "--log-format":
            shown = cell.split(",")[1].strip()
        if shown not in _as_readme(defaults[flag]):
            wrong[flag] = (cell, defaults[flag])
    assert not wrong


def test_the_check_sees_a_wrong_default():
    assert "`:9400`" in _as_readme(":9400") and "`:9401`" not in _as_readme(":9400")
    assert _as_readme(0.05) == {"`0.05`"} and "`1`" in _as_readme(1.0)
