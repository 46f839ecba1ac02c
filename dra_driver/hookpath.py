"""Where the enforcement library and the simulated driver live.

An installed wheel carries them in ``dra_driver/_native/`` (setup.py builds them with
``make -C hook``); a source checkout has them in ``<repo>/hook/build/`` after ``make -C hook``.
"""
from __future__ import annotations

from pathlib import Path

from .flags import StartupError

_FILES = {
    "library": "libgpushare.so",
    "sim_cuda": "sim/libcuda.so.1",
    "sim_nvml": "sim/libnvidia-ml.so.1",
    "probe": "gpushare-probe",
}


class NativeFilesMissing(StartupError, FileNotFoundError):
    """The native files are not built or not installed; the message says where it looked."""


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here / "_native", here.parent / "hook" / "build"]


def native_paths() -> dict[str, str]:
    """Absolute paths of library, sim_cuda, sim_nvml, probe and sim_dir (the folder to put on
    LD_LIBRARY_PATH for the simulated driver). Raises FileNotFoundError naming where it looked."""
    for base in _candidates():
        paths = {key: base / rel for key, rel in _FILES.items()}
        if all(p.is_file() for p in paths.values()):
            out = {key: str(p) for key, p in paths.items()}
            out["sim_dir"] = str(base / "sim")
            return out
    looked = ", ".join(str(b) for b in _candidates())
    raise NativeFilesMissing(
        f"gpushare native files ({', '.join(_FILES.values())}) not found; looked in: {looked}. "
        "Build them with `make -C hook` (source checkout) or reinstall the package.")
