"""GPU discovery: the mock backend's inputs, the NVML backend against a fake pynvml, and NVML
loaded from a driver root (the simulated NVML laid out as a driver installs libnvidia-ml.so.1)."""

import subprocess
import sys

import pytest
import yaml

from dra_driver.devicemodel import whole_gpu_device
from dra_driver.discovery import (
    DRIVER_LIBRARY_DIRS,
    SIM_DRIVER_VERSION,
    DiscoveryError,
    MockBackend,
    make_backend,
    sim_uuid,
)
from dra_driver.flags import FlagError
from tests.support.nvml import driver_root, fake_pynvml, needs_sim, sim_nvml_env


def test_mock_shorthand_groups():
    gpus = MockBackend("2x80Gi,1x40Gi").discover()
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.memory_bytes for g in gpus] == [80 << 30, 80 << 30, 40 << 30]
    assert gpus[2].uuid == "GPU-5ea1c0de-0000-4000-8000-000000000002" == sim_uuid(2)
    assert all(g.healthy and whole_gpu_device(g.index) == f"gpu-{g.index}" for g in gpus)


def test_mock_yaml_overrides_identity(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n- index: 3\n  memory: 24Gi\n  uuid: GPU-real-3\n")
    (gpu,) = MockBackend(str(f)).discover()
    assert (gpu.index, gpu.minor, gpu.uuid) == (3, 3, "GPU-real-3")


def test_mock_yaml_takes_a_lost_gpu_as_discover_prints_it(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n- index: 0\n  memory: '0'\n  healthy: false\n  healthReason: NVML cannot open GPU 0\n")
    (gpu,) = MockBackend(str(f)).discover()
    assert (gpu.memory_bytes, gpu.healthy) == (0, False)


def test_mock_yaml_is_reread(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n- memory: 24Gi\n  productName: NVIDIA L4\n- memory: 24Gi\n")
    backend = MockBackend(str(f))
    assert [g.product_name for g in backend.discover()] == ["NVIDIA L4", "NVIDIA Simulated GPU"]
    f.write_text("gpus:\n- memory: 24Gi\n  healthy: false\n  healthReason: XID 79\n")
    (gpu,) = backend.discover()
    assert not gpu.healthy and gpu.health_reason == "XID 79"


@pytest.mark.parametrize("spec, message", [
    ("", "empty"),
    ("2x-1Gi", "must not be negative"),
    ("2x0", "'0' in '2x0' is below 1Gi"),
    ("2x80", "'80' in '2x80' is below 1Gi"),
    ("0x80Gi", "count in '0x80Gi' is below 1"),
    ("1x80Gi,0x40Gi", "count in '0x40Gi' is below 1"),
    ("2x80Gi,lots", "'lots' is not COUNTxMEMORY"),
    ("/nonexistent.yaml", "neither COUNTxMEMORY"),
    # bounded before any arithmetic: no huge integer, no millions of devices
    ("2x1e1000000", r"--mock-gpus memory: exponent out of range \(at most e30\) \(got '1e1000000'\)"),
    ("2x" + "9" * 100, "--mock-gpus memory: longer than 64 characters"),
    ("2x9Ei", "--mock-gpus memory: out of range"),
    ("99999999999999999x1Gi", "more than 1024 GPUs"),
    ("1000x1Gi,25x1Gi", "more than 1024 GPUs"),
])
def test_mock_bad_specs(spec, message):
    with pytest.raises(DiscoveryError, match=message):
        MockBackend(spec)


@pytest.mark.parametrize("body, message", [
    ("[1, 2]", "list 'gpus'"),
    ("gpus:\n- 5\n", r"gpus\[0\]: expected a mapping"),
    ("gpus:\n- memory: 1Gi\n  colour: red\n", r"unknown field\(s\) \['colour'\]"),
    ("gpus:\n- memory: lots\n", r"gpus\[0\].memory: not a valid quantity"),
    ("gpus:\n- healthy: 'no'\n", r"gpus\[0\].healthy: expected bool"),
    ("gpus:\n- index: 1\n- index: 1\n", "indexes must be unique"),
    ("gpus: [\n", "cannot read"),
    ("gpus:\n- memory: 512Mi\n", r"gpus\[0\].memory: '512Mi' is below 1Gi"),
    ("gpus:\n- memory: 0\n", r"gpus\[0\].memory: 0 is below 1Gi"),
    ("gpus: []\nnodes: 2\n", r"unknown top-level key\(s\) \['nodes'\] \(accepted: gpus, sharing, devices\)"),
])
def test_mock_bad_yaml(tmp_path, body, message):
    f = tmp_path / "gpus.yaml"
    f.write_text(body)
    with pytest.raises(DiscoveryError, match=message):
        MockBackend(str(f))


def test_nvml_backend_maps_every_field(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    gpus = make_backend("nvml").discover()
    g = gpus[1]
    assert (g.index, g.uuid, g.minor, g.product_name, g.memory_bytes) == (
        1, "GPU-real-1", 11, "NVIDIA H100 80GB HBM3", 80 << 30)
    assert (g.architecture, g.cuda_compute_capability, g.driver_version, g.cuda_driver_version) == (
        "Hopper", "9.0", "580.65.06", "13.0")


def test_nvml_without_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init="Driver Not Loaded"))
    with pytest.raises(DiscoveryError, match="NVML could not be initialised: Driver Not Loaded.*--device-backend=mock"):
        make_backend("nvml")


def test_nvml_lost_gpu_is_reported_unhealthy(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(lost_index=0))
    lost, ok = make_backend("nvml").discover()
    assert not lost.healthy and "GPU is lost" in lost.health_reason
    assert ok.healthy


def test_unknown_backend():
    with pytest.raises(DiscoveryError, match="unknown backend 'cuda'"):
        make_backend("cuda")


# --driver-root: NVML loaded from a driver root mounted into the pod, as NVIDIA's DRA driver does.
# Each run is a child process: loading an NVML library into this one would outlive the test.
CLI = [sys.executable, "-m", "dra_driver.cli"]


def discover_nvml(tmp_path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child_env = sim_nvml_env(tmp_path / "sim.state", devices=2, memory=24 << 30) | (env or {})
    return subprocess.run([*CLI, "discover", "--device-backend", "nvml", *flags], capture_output=True, text=True,
                          timeout=60, env=child_env)


@needs_sim
@pytest.mark.parametrize("libdir", ["usr/lib/x86_64-linux-gnu", "usr/lib64"])
def test_nvml_is_loaded_from_the_driver_root(tmp_path, libdir):
    root = driver_root(tmp_path, libdir)
    res = discover_nvml(tmp_path, "--driver-root", str(root))
    assert res.returncode == 0, res.stderr
    gpus = yaml.safe_load(res.stdout)["gpus"]
    assert [(g["uuid"], g["memory"], g["driverVersion"]) for g in gpus] == [
        (sim_uuid(0), "24Gi", SIM_DRIVER_VERSION), (sim_uuid(1), "24Gi", SIM_DRIVER_VERSION)]


@needs_sim
def test_driver_root_is_settable_by_its_variable(tmp_path):
    res = discover_nvml(tmp_path, env={"GPUSHARE_DRIVER_ROOT": str(driver_root(tmp_path))})
    assert res.returncode == 0, res.stderr
    assert len(yaml.safe_load(res.stdout)["gpus"]) == 2


def test_driver_root_without_nvml_names_the_flag_and_every_path(tmp_path):
    root = driver_root(tmp_path, libdir=None)
    res = discover_nvml(tmp_path, "--driver-root", str(root))
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()
    looked = ", ".join(str(root / d / "libnvidia-ml.so.1") for d in DRIVER_LIBRARY_DIRS)
    assert line.startswith(f"gpushare-dra discover: error: --driver-root: libnvidia-ml.so.1 not found under "
                           f"'{root}'; looked in {looked} (accepted: ")
    assert str(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") in looked  # where Debian's driver puts it


def test_driver_root_with_a_file_that_is_no_library_is_one_error(tmp_path):
    root = driver_root(tmp_path, libdir=None)
    (root / "usr/lib64").mkdir()
    (root / "usr/lib64/libnvidia-ml.so.1").write_text("truncated\n")
    res = discover_nvml(tmp_path, "--driver-root", str(root))
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    library = root / "usr/lib64/libnvidia-ml.so.1"
    assert line.startswith(f"gpushare-dra discover: error: --driver-root: cannot load {library}: ")


def test_driver_root_is_refused_with_the_mock_backend():
    with pytest.raises(FlagError, match="--driver-root: only with --device-backend nvml"):
        make_backend("mock", driver_root="/")
