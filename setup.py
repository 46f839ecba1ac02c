"""Builds the native parts (hook/: libgpushare.so, the simulated driver, the probe) into the
package as dra_driver/_native/. Everything else about the package is in pyproject.toml."""
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
ARTIFACTS = ["libgpushare.so", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1", "gpushare-probe"]


class BuildWithNative(build_py):
    def run(self):
        super().run()
        subprocess.run(["make", "-C", str(ROOT / "hook")], check=True)
        dest = Path(self.build_lib) / "dra_driver" / "_native"
        for rel in ARTIFACTS:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / "hook" / "build" / rel, target)


setup(cmdclass={"build_py": BuildWithNative})
