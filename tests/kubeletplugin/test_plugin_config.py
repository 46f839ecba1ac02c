"""PluginConfig is the one typed configuration of `gpushare-dra kubelet-plugin`: the flags give
the same values as PluginConfig's defaults, and the environment reaches it through the CLI."""

import dataclasses

import pytest

from dra_driver.cli import build_parser
from kubeletplugin.config import DEFAULTS, PluginConfig


def _parse(*argv: str) -> PluginConfig:
    return PluginConfig.from_args(build_parser().parse_args(["kubelet-plugin", *argv]))


def test_flag_defaults_are_the_config_defaults(monkeypatch):
    for name in ("NODE_NAME", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert _parse() == DEFAULTS


def test_flags_and_environment_reach_the_config(monkeypatch):
    monkeypatch.setenv("GPUSHARE_STATE_DIR", "/srv/gpushare")
    monkeypatch.setenv("GPUSHARE_HEALTH_IGNORE_XIDS", "63, 92")
    config = _parse("--node-name", "n1", "--mps-control", "mps-control -d", "--no-publish-slices")
    assert (config.node_name, config.state_dir, config.health_ignore_xids) == ("n1", "/srv/gpushare",
                                                                              frozenset({63, 92}))
    assert config.mps_control == ("mps-control", "-d") and config.publish_slices is False


def test_the_config_is_frozen_and_names_every_flag():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.state_dir = "/tmp"  # type: ignore[misc]
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    dests = {a.dest for a in sub.choices["kubelet-plugin"]._actions} - {"help", "log_level", "log_format"}
    assert dests == {f.name for f in dataclasses.fields(PluginConfig)}
