"""GPU discovery: one data model, two backends.

- `nvml`: the node's real GPUs through NVML (nvidia-ml-py's `pynvml`).
- `mock`: simulated GPUs described by `--mock-gpus` ("2x80Gi", "1x80Gi,2x40Gi", or a YAML
  file). Their identities match the simulated driver in hook/sim (docs/interfaces.md), so
  limits written for a mock GPU are found by the library running on the sim driver.

Both return `GpuInfo` records; callers never see a backend-specific type or a raw NVML
exception: every failure is a `DiscoveryError` whose message says what to check.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from .flags import FlagError, StartupError
from .mig import MigError, MigProfile, read_profiles
from .quantity import QuantityError, format_bytes, parse_bytes

# Identity of simulated GPUs; must stay equal to the defaults of hook/sim (docs/interfaces.md).
SIM_UUID_PREFIX = "GPU-5ea1c0de-0000-4000-8000-"
SIM_PRODUCT_NAME = "NVIDIA Simulated GPU"
SIM_ARCHITECTURE = "Hopper"
SIM_COMPUTE_CAPABILITY = "9.0"
SIM_DRIVER_VERSION = "580.0.0"
SIM_CUDA_DRIVER_VERSION = "13.0"
SIM_BRAND = "Nvidia"  # what NVML reports for data-center GPUs since Hopper (NVML_BRAND_NVIDIA)
SIM_SM_COUNT = 132  # an H100 SXM's (hook/sim/sim_state.h SIM_SM_COUNT)

# CUDA cores per SM by compute capability, as NVIDIA's cuda-samples list them (helper_cuda.h,
# _ConvertSMVer2Cores): NVML gives a GPU's cores, not its SMs. Volta (7.0) on: MPS's SM limits.
_CORES_PER_SM = {"7.0": 64, "7.2": 64, "7.5": 64, "8.0": 64, "8.6": 128, "8.7": 128, "8.9": 128,
                 "9.0": 128, "10.0": 128, "10.1": 128, "10.3": 128, "11.0": 128, "12.0": 128, "12.1": 128}

# NVML_BRAND_* values as NVIDIA's DRA driver names them (go-nvlib's GetBrandAsString), so
# selectors on `brand` mean the same on both drivers.
_NVML_BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}
SYSFS_ROOT = "/sys"
# extended BDF, lower case: what k8s.io/dynamic-resource-allocation/deviceattribute accepts
_PCI_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")  # fullmatch only

# NVML_DEVICE_ARCH_* values; NVML returns an integer.
_NVML_ARCHITECTURES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada", 9: "Hopper", 10: "Blackwell", 13: "Rubin",
}


class DiscoveryError(StartupError, RuntimeError):
    """GPUs could not be discovered; the message explains what to check."""


@dataclass(frozen=True)
class GpuInfo:
    """What the driver knows about one physical GPU."""

    index: int
    uuid: str
    minor: int
    product_name: str
    memory_bytes: int
    architecture: str
    cuda_compute_capability: str  # "9.0"
    driver_version: str  # "580.65.06"
    cuda_driver_version: str  # "13.0"
    brand: str = ""  # "Nvidia", "Tesla", ... (NVML's brand); "" when unknown
    pci_bus_id: str = ""  # "0000:3b:00.0"; "" when unknown
    pcie_root: str = ""  # the PCIe root complex, "pci0000:3a"; "" when sysfs does not say
    sm_count: int = 0  # streaming multiprocessors; 0 when NVML cannot tell (MPS claims are then paced)
    healthy: bool = True
    health_reason: str = ""  # why it is unhealthy, for taints and logs
    mig_mode: bool = False  # MIG mode enabled (by the operator; the driver never switches it)
    mig_profiles: tuple[MigProfile, ...] = ()  # in MIG mode: its GPU-instance profiles (docs/mig.md)


class DeviceBackend(Protocol):
    name: str

    def discover(self) -> list[GpuInfo]:
        """The GPUs present now, healthy or not, ordered by index."""
        ...


def sim_uuid(index: int) -> str:
    return f"{SIM_UUID_PREFIX}{index:012x}"


def sim_pci_bus_id(index: int) -> str:
    """PCI address of simulated GPU `index`: bus index + 1 (as hook/sim's NVML reports it)."""
    return f"{(index + 1) >> 8:04x}:{(index + 1) & 0xff:02x}:00.0"


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as the extended BDF `0000:3b:00.0` (go-nvlib's GetPCIBusID)."""
    bus_id = nvml_bus_id.lower()
    return bus_id[4:] if re.match(r"0000[0-9a-f]{4}:", bus_id) else bus_id


def pcie_root(bus_id: str, sysfs: str = SYSFS_ROOT) -> str:
    """The PCIe root complex above a PCI device ("pci0000:3a"), "" when sysfs does not say.

    As k8s.io/dynamic-resource-allocation/deviceattribute derives resource.kubernetes.io/pcieRoot:
    /sys/bus/pci/devices/<bus id> links to /sys/devices/<root>/.../<bus id>; the root is the
    first folder under /sys/devices."""
    if not _PCI_BUS_ID.fullmatch(bus_id):
        return ""
    link = os.path.join(sysfs, "bus", "pci", "devices", bus_id)
    try:
        target = os.readlink(link)
    except OSError:
        return ""
    target = os.path.normpath(os.path.join(os.path.dirname(link), target))
    devices = os.path.join(sysfs, "devices") + os.sep
    if not target.startswith(devices + "pci") or os.path.basename(target) != bus_id:
        return ""
    return target[len(devices):].split(os.sep)[0]


def _mock_gpu(index: int, memory_bytes: int, **overrides: Any) -> GpuInfo:  # Any: _from_yaml checks each type
    gpu = GpuInfo(
        index=index,
        uuid=sim_uuid(index),
        minor=index,
        product_name=SIM_PRODUCT_NAME,
        memory_bytes=memory_bytes,
        architecture=SIM_ARCHITECTURE,
        cuda_compute_capability=SIM_COMPUTE_CAPABILITY,
        driver_version=SIM_DRIVER_VERSION,
        cuda_driver_version=SIM_CUDA_DRIVER_VERSION,
        brand=SIM_BRAND,
        pci_bus_id=sim_pci_bus_id(index),
        # one root complex per PCI domain, as on a single-socket host
        pcie_root=f"pci{sim_pci_bus_id(index)[:4]}:00",
        sm_count=SIM_SM_COUNT,
    )
    return replace(gpu, **overrides) if overrides else gpu


_COUNT_X_MEMORY = re.compile(r"\s*([0-9]+)\s*x\s*([^\s:]+)(:mig)?\s*")  # fullmatch only
MIN_MOCK_MEMORY = 1 << 30  # a smaller "GPU" is a missing unit ("2x80": 80 bytes), never meant
MAX_MOCK_GPUS = 1024  # a bound, so a typo cannot build millions of devices
SHORTHAND_ACCEPTED = ("accepted: COUNTxMEMORY groups such as 2x80Gi or 1x80Gi,2x40Gi (1x80Gi:mig: in MIG mode), "
                      "or a YAML file")
# Top-level keys of a mock GPU file: `discover` prints all three; only `gpus` is read.
_MOCK_YAML_KEYS = ("gpus", "sharing", "devices")

# YAML keys (camelCase, as `discover` prints them) of a mock GPU entry and the GpuInfo field each sets.
_MOCK_YAML_FIELDS = {
    "uuid": "uuid",
    "productName": "product_name",
    "architecture": "architecture",
    "cudaComputeCapability": "cuda_compute_capability",
    "driverVersion": "driver_version",
    "cudaDriverVersion": "cuda_driver_version",
    "brand": "brand",
    "pciBusID": "pci_bus_id",
    "pcieRoot": "pcie_root",
    "healthy": "healthy",
    "healthReason": "health_reason",
    "migMode": "mig_mode",
}
_MOCK_BOOL_FIELDS = ("healthy", "mig_mode")


class MockBackend:
    """Simulated GPUs from `--mock-gpus`.

    A YAML file is read again on every `discover()`, so a test (or an operator on a
    mock cluster) can make a GPU disappear or turn unhealthy by editing the file.

    A GPU with `migMode: true` starts in MIG mode on the simulated driver too (SimDriver passes
    GPUSHARE_SIM_MIG); once the plugin sets `mig_nvml` (pynvml on hook/sim's libnvidia-ml.so.1),
    MIG mode and profiles are the simulated NVML's, read by the same calls as on a real GPU.
    """

    name = "mock"

    def __init__(self, spec: str):
        if not spec or not spec.strip():
            raise DiscoveryError(f"--mock-gpus: empty ({SHORTHAND_ACCEPTED})")
        self.spec = spec.strip()
        self.mig_nvml: Any = None
        self.discover()  # fail at start-up, not at the first reconcile

    def discover(self) -> list[GpuInfo]:
        if _COUNT_X_MEMORY.fullmatch(self.spec.split(",")[0]):
            gpus = self._from_shorthand(self.spec)
        else:
            gpus = self._from_yaml(Path(self.spec))
        if self.mig_nvml is None:
            return gpus
        return [self._mig(g) if g.healthy else g for g in gpus]

    def _mig(self, gpu: GpuInfo) -> GpuInfo:
        """MIG mode and profiles as the simulated NVML has them now: `migMode` is where the
        simulated GPU starts; an operator may switch it there since (nvmlDeviceSetMigMode)."""
        nvml = self.mig_nvml
        try:
            profiles = read_profiles(nvml, nvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
        except (nvml.NVMLError, MigError) as e:
            raise DiscoveryError(f"simulated NVML: the MIG profiles of GPU {gpu.index} ({gpu.uuid}): {e}") from None
        return replace(gpu, mig_mode=profiles is not None, mig_profiles=profiles or ())

    @staticmethod
    def _from_shorthand(spec: str) -> list[GpuInfo]:
        gpus: list[GpuInfo] = []
        for group in spec.split(","):
            m = _COUNT_X_MEMORY.fullmatch(group)
            if not m:
                raise DiscoveryError(f"--mock-gpus: {group!r} is not COUNTxMEMORY ({SHORTHAND_ACCEPTED})")
            if len(m.group(1)) > 4 or len(gpus) + int(m.group(1)) > MAX_MOCK_GPUS:  # length first: no huge int()
                raise DiscoveryError(f"--mock-gpus: more than {MAX_MOCK_GPUS} GPUs in {spec!r}")
            if int(m.group(1)) < 1:
                raise DiscoveryError(f"--mock-gpus: count in {group!r} is below 1 ({SHORTHAND_ACCEPTED})")
            memory = _mock_memory(m.group(2), "--mock-gpus memory", f" in {group!r}")
            gpus.extend(_mock_gpu(len(gpus), memory, mig_mode=bool(m.group(3))) for _ in range(int(m.group(1))))
        return gpus

    @staticmethod
    def _from_yaml(path: Path) -> list[GpuInfo]:
        try:
            doc = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise DiscoveryError(f"--mock-gpus: {str(path)!r} is neither COUNTxMEMORY nor an existing file "
                                 f"({SHORTHAND_ACCEPTED})") from None
        except (OSError, yaml.YAMLError) as e:
            raise DiscoveryError(f"--mock-gpus: cannot read {path}: {e}") from None
        entries = doc.get("gpus") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise DiscoveryError(f"--mock-gpus: {path} must hold a mapping with a list 'gpus' "
                                 "(what `gpushare-dra discover` prints)")
        unknown = set(doc) - set(_MOCK_YAML_KEYS)
        if unknown:
            raise DiscoveryError(f"{path}: unknown top-level key(s) {sorted(unknown)} "
                                 f"(accepted: {', '.join(_MOCK_YAML_KEYS)})")
        if len(entries) > MAX_MOCK_GPUS:
            raise DiscoveryError(f"--mock-gpus: {path} lists {len(entries)} GPUs, more than {MAX_MOCK_GPUS}")
        gpus = []
        for i, entry in enumerate(entries):
            where = f"{path}: gpus[{i}]"
            if not isinstance(entry, dict):
                raise DiscoveryError(f"{where}: expected a mapping, got {entry!r}")
            unknown = set(entry) - set(_MOCK_YAML_FIELDS) - {"memory", "index"}
            if unknown:
                accepted = ", ".join(["index", "memory", *_MOCK_YAML_FIELDS])
                raise DiscoveryError(f"{where}: unknown field(s) {sorted(unknown)} (accepted, camelCase: {accepted})")
            # 0 only for an unhealthy GPU: what `discover` prints for a GPU NVML lost
            memory = _mock_memory(entry.get("memory", "16Gi"), f"{where}.memory", lost=entry.get("healthy") is False)
            index = entry.get("index", i)
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise DiscoveryError(f"{where}.index: expected a non-negative integer, got {index!r}")
            overrides = {}
            for key, attr in _MOCK_YAML_FIELDS.items():
                if key in entry:
                    want = bool if attr in _MOCK_BOOL_FIELDS else str
                    if not isinstance(entry[key], want):
                        raise DiscoveryError(f"{where}.{key}: expected {want.__name__}, got {entry[key]!r}")
                    overrides[attr] = entry[key]
            if overrides.get("pci_bus_id") and not _PCI_BUS_ID.fullmatch(str(overrides["pci_bus_id"])):
                raise DiscoveryError(f"{where}.pciBusID: expected a PCI address domain:bus:device.function in "
                                     f"lower-case hex, e.g. 0000:3b:00.0, got {entry['pciBusID']!r}")
            gpus.append(_mock_gpu(index, memory, **overrides))
        indexes = [g.index for g in gpus]
        if len(set(indexes)) != len(indexes):
            raise DiscoveryError(f"{path}: GPU indexes must be unique, got {indexes}")
        return sorted(gpus, key=lambda g: g.index)


def _mock_memory(value: object, field: str, where: str = "", lost: bool = False) -> int:
    try:
        memory = parse_bytes(value, field)
    except QuantityError as e:
        raise DiscoveryError(str(e)) from None
    if memory < MIN_MOCK_MEMORY and not (lost and memory == 0):
        raise DiscoveryError(f"{field}: {value!r}{where} is below 1Gi (accepted: 1Gi or more, with its unit: 80Gi)")
    return memory


def mock_entry(gpu: GpuInfo) -> dict[str, object]:
    """A GPU as one entry of a mock GPU file: what `discover` prints, read back by --mock-gpus FILE."""
    entry: dict[str, object] = {"index": gpu.index, "memory": format_bytes(gpu.memory_bytes)}
    entry.update({key: getattr(gpu, attr) for key, attr in _MOCK_YAML_FIELDS.items()})
    if not entry["healthReason"]:
        del entry["healthReason"]
    if not entry["migMode"]:
        del entry["migMode"]
    return entry


NVML_LIBRARY = "libnvidia-ml.so.1"
# Where a driver installation keeps libnvidia-ml.so.1, relative to its root, in the order NVIDIA's
# DRA driver looks (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/root.go: findFile, getDriverLibraryPath).
DRIVER_LIBRARY_DIRS = ("", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
                       "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib")


def find_nvml(driver_root: str) -> str:
    """The path of libnvidia-ml.so.1 under `driver_root` (the first of DRIVER_LIBRARY_DIRS that has it)."""
    looked = [os.path.join(driver_root, d, NVML_LIBRARY) for d in DRIVER_LIBRARY_DIRS]
    for path in looked:
        if os.path.isfile(path):  # follows the link libnvidia-ml.so.1 -> libnvidia-ml.so.<driver version>
            return path
    raise FlagError("--driver-root", f"{NVML_LIBRARY} not found under {driver_root!r}; looked in "
                    f"{', '.join(looked)} (accepted: where the NVIDIA driver's root filesystem is mounted; the "
                    "DaemonSet mounts the host's / there, or /run/nvidia/driver with deploy/components/gpu-operator, "
                    "where the GPU Operator's driver container puts it once the driver is loaded)")


def load_nvml(driver_root: str) -> str:
    """Load the driver root's NVML before pynvml's nvmlInit: pynvml's own dlopen("libnvidia-ml.so.1")
    then finds this copy by its soname, not whatever the container's loader path holds."""
    path = find_nvml(driver_root)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:  # another architecture, a truncated file
        raise FlagError("--driver-root", f"cannot load {path}: {e}") from None
    return path


class NvmlBackend:
    """The node's real GPUs through NVML: from `driver_root` when set (a driver root mounted into
    the pod), else wherever the dynamic loader finds libnvidia-ml.so.1 (a host, or a container the
    NVIDIA container toolkit injected it into)."""

    name = "nvml"

    def __init__(self, driver_root: str | None = None, sysfs: str = SYSFS_ROOT) -> None:
        import pynvml  # imported here so the mock backend works without the NVML bindings' library

        self._nvml = pynvml
        self._sysfs = sysfs
        library = load_nvml(driver_root) if driver_root is not None else NVML_LIBRARY
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            where = (f"{library} (from --driver-root {driver_root})" if driver_root is not None else
                     f"{NVML_LIBRARY} from the dynamic loader's path; set --driver-root to the mounted driver root "
                     "to load it from there")
            raise DiscoveryError(
                f"NVML could not be initialised: {e}. Is the NVIDIA driver installed and loaded? NVML: {where}. "
                "Use --device-backend=mock for simulated GPUs."
            ) from None

    def discover(self) -> list[GpuInfo]:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()
        except nvml.NVMLError as e:
            raise DiscoveryError(f"NVML query of the system failed: {e}") from None
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return [self._one(i, driver, cuda_version) for i in range(count)]

    def _one(self, index: int, driver: str, cuda_version: str) -> GpuInfo:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as e:
            # A GPU NVML counts but cannot open is lost (fell off the bus, XID 79).
            return GpuInfo(index, f"unknown-{index}", index, "unknown", 0, "unknown", "0.0", driver,
                           cuda_version, healthy=False, health_reason=f"NVML cannot open GPU {index}: {e}")
        try:
            major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            brand, bus_id = self._placement(handle)
            return GpuInfo(
                index=index,
                uuid=uuid,
                minor=nvml.nvmlDeviceGetMinorNumber(handle),
                product_name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                architecture=_NVML_ARCHITECTURES.get(nvml.nvmlDeviceGetArchitecture(handle), "unknown"),
                cuda_compute_capability=f"{major}.{minor_cc}",
                driver_version=driver,
                cuda_driver_version=cuda_version,
                brand=brand,
                pci_bus_id=bus_id,
                pcie_root=pcie_root(bus_id, self._sysfs),
                sm_count=self._sm_count(handle, f"{major}.{minor_cc}"),
                **self._mig(handle),
            )
        except nvml.NVMLError as e:
            return GpuInfo(index, uuid, index, "unknown", 0, "unknown", "0.0", driver, cuda_version,
                           healthy=False, health_reason=f"NVML query of GPU {index} ({uuid}) failed: {e}")


    def _mig(self, handle: Any) -> dict[str, Any]:
        """MIG mode and profiles, read only (docs/mig.md): a GPU whose MIG query fails is in MIG mode
        with no profiles, so it is offered neither as MIG devices nor whole (CUDA cannot use a GPU
        in MIG mode outside its instances)."""
        try:
            profiles = read_profiles(self._nvml, handle)
        except MigError:
            return {"mig_mode": True}
        return {} if profiles is None else {"mig_mode": True, "mig_profiles": profiles}

    def _sm_count(self, handle: Any, compute_capability: str) -> int:
        """The GPU's SMs: NVML's CUDA cores over the cores per SM of its compute capability; 0
        when either is unknown (an older driver, a newer GPU than the table)."""
        per_sm = _CORES_PER_SM.get(compute_capability)
        try:
            cores = int(self._nvml.nvmlDeviceGetNumGpuCores(handle)) if per_sm else 0
        except self._nvml.NVMLError:
            cores = 0
        return cores // per_sm if per_sm and cores % per_sm == 0 else 0

    def _placement(self, handle: Any) -> tuple[str, str]:
        """(brand, PCI address); "" for what this GPU's NVML does not tell: they describe the GPU
        for selectors, so not knowing one leaves its attribute out rather than failing the GPU."""
        nvml = self._nvml
        try:
            brand = _NVML_BRANDS.get(nvml.nvmlDeviceGetBrand(handle), "Unknown")
        except nvml.NVMLError:
            brand = ""
        try:
            bus_id = pci_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError:
            bus_id = ""
        return brand, bus_id


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def make_backend(name: str, mock_gpus: str | None = None, driver_root: str | None = None) -> DeviceBackend:
    """The backend for `--device-backend` (and `--mock-gpus` for the mock one, 1x16Gi unset;
    `--driver-root` for the nvml one)."""
    if name == "mock":
        if driver_root is not None:  # no driver to load: a mistake, not a no-op
            raise FlagError("--driver-root", "only with --device-backend nvml (the mock backend loads no driver); "
                            "remove it")
        return MockBackend(mock_gpus or "1x16Gi")
    if mock_gpus is not None:  # simulated GPUs asked for on a real backend: a mistake, not a no-op
        raise FlagError("--mock-gpus", f"only with --device-backend mock (this is --device-backend {name}); "
                        "remove it, or add --device-backend mock")
    if name == "nvml":
        return NvmlBackend(driver_root)
    raise DiscoveryError(f"--device-backend: unknown backend {name!r}; choose nvml or mock")
