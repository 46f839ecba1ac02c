"""GPU discovery: the mock backend's inputs, the NVML backend against a fake pynvml and against
the simulated NVML (hook/sim) through the real pynvml, PCIe roots from a simulated sysfs, and NVML
loaded from a driver root (the simulated NVML laid out as a driver installs libnvidia-ml.so.1)."""

import dataclasses
import json
import os
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
    NvmlBackend,
    make_backend,
    pcie_root,
    sim_uuid,
)
from dra_driver.flags import FlagError
from tests.support import BUILD, REPO
from tests.support.nvml import driver_root, fake_pynvml, needs_sim, sim_nvml_env


def fake_sysfs(root, bus_id, *bridges, pcie="pci0000:3a"):
    """/sys/devices/<pcie>/<bridges>/<bus_id> and the /sys/bus/pci/devices/<bus_id> link to it,
    relative as the kernel writes it."""
    device = os.path.join(root, "devices", pcie, *bridges, bus_id)
    os.makedirs(device, exist_ok=True)
    links = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(links, exist_ok=True)
    os.symlink(os.path.relpath(device, links), os.path.join(links, bus_id))


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


def test_nvml_backend_maps_every_field(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    fake_sysfs(str(tmp_path), "0000:3c:00.0", "0000:3a:00.0", "0000:3b:00.0")
    gpus = NvmlBackend(sysfs=str(tmp_path)).discover()
    g = gpus[1]
    assert (g.index, g.uuid, g.minor, g.product_name, g.memory_bytes) == (
        1, "GPU-real-1", 11, "NVIDIA H100 80GB HBM3", 80 << 30)
    assert (g.architecture, g.cuda_compute_capability, g.driver_version, g.cuda_driver_version) == (
        "Hopper", "9.0", "580.65.06", "13.0")
    assert (g.brand, g.pci_bus_id, g.pcie_root) == ("Nvidia", "0000:3c:00.0", "pci0000:3a")
    assert g.sm_count == 132  # 16896 cores of compute capability 9.0, 128 a SM
    assert (gpus[0].pci_bus_id, gpus[0].pcie_root) == ("0000:3b:00.0", "")  # not in this sysfs


def test_nvml_without_brand_or_pci_info_leaves_them_unknown(monkeypatch):
    """Not every GPU's NVML answers every query: the GPU is still published, healthy."""
    pynvml = fake_pynvml()

    def not_supported(handle):
        raise pynvml.NVMLError("Not Supported")

    pynvml.nvmlDeviceGetBrand = pynvml.nvmlDeviceGetPciInfo = pynvml.nvmlDeviceGetNumGpuCores = not_supported
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    g = make_backend("nvml").discover()[0]
    assert (g.healthy, g.brand, g.pci_bus_id, g.pcie_root, g.memory_bytes) == (True, "", "", "", 80 << 30)
    assert g.sm_count == 0  # unknown: the library paces MPS claims' processes (docs/strategies.md)


def test_sm_count_is_unknown_for_a_compute_capability_not_in_the_table(monkeypatch):
    pynvml = fake_pynvml()
    pynvml.nvmlDeviceGetCudaComputeCapability = lambda h: (13, 0)
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    assert make_backend("nvml").discover()[0].sm_count == 0


def test_pcie_root_from_sysfs(tmp_path):
    root = str(tmp_path)
    fake_sysfs(root, "0000:17:00.0", pcie="pci0000:16")
    assert pcie_root("0000:17:00.0", root) == "pci0000:16"
    assert pcie_root("0000:18:00.0", root) == ""  # no such device
    assert pcie_root("0000:17:00.0") == ""  # not on this machine's /sys
    os.makedirs(tmp_path / "elsewhere" / "0000:19:00.0")  # a link outside /sys/devices/pci*
    os.symlink(tmp_path / "elsewhere" / "0000:19:00.0", tmp_path / "bus" / "pci" / "devices" / "0000:19:00.0")
    assert pcie_root("0000:19:00.0", root) == ""
    assert pcie_root("../../../etc", root) == ""  # not a PCI address: never a path


def test_simulated_nvml_and_mock_backend_describe_the_same_gpus(tmp_path):
    """The real pynvml on hook/sim's libnvidia-ml.so.1, in a process of its own (NVML is loaded
    once per process), finds what the mock backend publishes for the same GPUs."""
    if not (BUILD / "sim" / "libnvidia-ml.so.1").is_file():
        pytest.skip("hook/build not built (make -C hook)")
    sysfs = str(tmp_path / "sys")
    for bus_id in ("0000:01:00.0", "0000:02:00.0"):
        fake_sysfs(sysfs, bus_id, pcie="pci0000:00")
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUILD / "sim"), "GPUSHARE_SIM_DEVICES": "2",
           "GPUSHARE_SIM_MEMORY": "80Gi", "GPUSHARE_SIM_STATE": str(tmp_path / "sim.state")}
    script = ("import dataclasses, json, sys; from dra_driver.discovery import NvmlBackend; "
              "print(json.dumps([dataclasses.asdict(g) for g in NvmlBackend(sysfs=sys.argv[1]).discover()]))")
    out = subprocess.run([sys.executable, "-c", script, sysfs], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found == json.loads(json.dumps([dataclasses.asdict(g) for g in MockBackend("2x80Gi").discover()]))
    assert [(g["brand"], g["pci_bus_id"], g["pcie_root"]) for g in found] == [
        ("Nvidia", "0000:01:00.0", "pci0000:00"), ("Nvidia", "0000:02:00.0", "pci0000:00")]


def test_mock_yaml_pci_location(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n- pciBusID: 0000:c1:00.0\n  pcieRoot: pci0000:c0\n  brand: Tesla\n- {}\n")
    first, second = MockBackend(str(f)).discover()
    assert (first.pci_bus_id, first.pcie_root, first.brand) == ("0000:c1:00.0", "pci0000:c0", "Tesla")
    assert (second.pci_bus_id, second.pcie_root, second.brand) == ("0000:02:00.0", "pci0000:00", "Nvidia")
    f.write_text("gpus:\n- pciBusID: 0000:C1:00.0\n")
    with pytest.raises(DiscoveryError, match=r"gpus\[0\]\.pciBusID: expected a PCI address .* got '0000:C1:00.0'"):
        MockBackend(str(f))


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


def test_mock_shorthand_puts_gpus_in_mig_mode():
    gpus = MockBackend("1x80Gi:mig,2x40Gi").discover()
    assert [(g.index, g.mig_mode, g.mig_profiles) for g in gpus] == [(0, True, ()), (1, False, ()), (2, False, ())]
    with pytest.raises(DiscoveryError, match="'1x80Gi:migs' is neither COUNTxMEMORY nor an existing file"):
        MockBackend("1x80Gi:migs")
