"""The command line: the contract's flags and defaults, and clear errors."""

import subprocess
import sys

import pytest

from dra_driver.cli import build_parser

CLI = [sys.executable, "-m", "dra_driver.cli"]


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_kubelet_plugin_defaults_match_the_contract(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "node-a")
    args = parse("kubelet-plugin")
    assert args.node_name == "node-a"
    assert args.kubeconfig is None
    assert args.driver_name == "gpushare.dev"
    assert args.plugin_dir is None  # resolved to /var/lib/kubelet/plugins/<driver-name>
    assert args.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert args.cdi_root == "/var/run/cdi"
    assert args.state_dir == "/var/lib/gpushare"
    assert args.device_backend == "nvml"
    assert args.sharing_mode == "auto"
    assert args.partitions == 8
    assert args.metrics_addr == ":9400"


@pytest.mark.parametrize("command", ["kubelet-plugin", "controller", "cleanup", "discover", "demo", "hook-path", "install-hook", "emulator"])
def test_every_subcommand_has_help(command):
    out = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"usage: gpushare-dra {command}")


def test_plugin_help_teaches_every_contract_flag():
    out = subprocess.run([*CLI, "kubelet-plugin", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--node-name", "--kubeconfig", "--driver-name", "--plugin-dir", "--registry-dir", "--cdi-root",
                 "--state-dir", "--device-backend", "--mock-gpus", "--sharing-mode", "--partitions", "--hook-dir",
                 "--metrics-addr", "--log-level"):
        assert flag in out
    assert "/var/lib/kubelet/plugins/<driver-name>" in out
    assert "DRAConsumableCapacity" in out


@pytest.mark.parametrize("argv, message", [
    (["kubelet-plugin", "--partitions", "0"], "0 is out of range 1..128"),
    (["kubelet-plugin", "--partitions", "eight"], "'eight' is not an integer"),
    (["kubelet-plugin", "--sharing-mode", "slices"], "invalid choice: 'slices'"),
    (["discover", "--device-backend", "mock", "--mock-gpus", "2xlots"], "--mock-gpus memory: not a valid quantity"),
])
def test_bad_flags_are_named(argv, message):
    res = subprocess.run([*CLI, *argv], capture_output=True, text=True)
    assert res.returncode == 2
    assert message in res.stderr


def test_discover_mock_prints_gpus():
    res = subprocess.run([*CLI, "discover", "--device-backend", "mock", "--mock-gpus", "2x24Gi"],
                         capture_output=True, text=True, check=True)
    assert res.stdout.count("uuid: GPU-5ea1c0de-0000-4000-8000-") == 2
    assert "memory_bytes: 25769803776" in res.stdout
