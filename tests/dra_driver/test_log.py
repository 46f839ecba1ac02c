"""Logging: JSON lines for collectors, readable lines on a terminal, stdlib loggers included."""

import json
import logging

import pytest

from dra_driver.log import configure, get_logger


def test_json_lines_carry_fields_and_stdlib_records(capsys):
    configure("info", "json")
    get_logger("plugin").info("claim prepared", claim="ns/c", uid="u-1")
    logging.getLogger("grpc").warning("from the standard library")
    get_logger("plugin").debug("hidden at info")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [entry["event"] for entry in lines] == ["claim prepared", "from the standard library"]
    assert lines[0]["claim"] == "ns/c" and lines[0]["level"] == "info" and lines[0]["logger"] == "plugin"
    assert lines[1]["level"] == "warning" and "timestamp" in lines[1]


def test_console_format_is_not_json(capsys):
    configure("debug", "console")
    get_logger("plugin").debug("readable", gpu=0)
    err = capsys.readouterr().err
    assert "readable" in err and "gpu" in err and not err.lstrip().startswith("{")


def test_bad_level_is_named():
    with pytest.raises(ValueError, match="--log-level: 'loud'"):
        configure("loud", "json")
