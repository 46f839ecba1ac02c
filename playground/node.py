"""One simulated GPU node: what the demo and `gpushare-dra playground` both run.

A workdir laid out like a node (the plugin's folders, the installed hook with the simulated
driver, a CDI folder), the real kubelet plugin on mock GPUs talking to an API server, the
kubelet's side of its sockets, and a container runner (podman + runc when it can run here,
else host processes with the CDI spec applied). No NVIDIA driver means no
nvidia-cuda-mps-control: the plugin runs the stand-in (mpscontrol.py), so MPS claims work.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from kubeletplugin.config import PluginConfig, SharingMode

from .claims import DRIVER

if TYPE_CHECKING:  # imported where used: `--help` stays quick
    from kubeletplugin.main import Plugin

    from .containers import PodmanRunner, ProcessRunner
    from .kubelet import Kubelet

# The DeviceClass deploy/base/deviceclass.yaml installs (tests/e2e checks they are the same).
# Bodies are the API's JSON; the client sends a dict as it is (its methods are typed for its models).
# Devices whose GPU serves TimeSlicing and None claims (its sharingStrategy is not MPS: the
# plugin's --mps-gpus; docs/strategies.md, Keeping strategies apart); a slice published before the
# attribute existed has none and serves them too.
NOT_MPS_ONLY = (f'!("sharingStrategy" in device.attributes["{DRIVER}"]) || '
                f'device.attributes["{DRIVER}"].sharingStrategy != "MPS"')
NOT_MIG = f'!("sharing" in device.attributes["{DRIVER}"]) || device.attributes["{DRIVER}"].sharing != "mig"'
DEVICE_CLASS: Any = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                           {"cel": {"expression": NOT_MPS_ONLY}}, {"cel": {"expression": NOT_MIG}}]},
}
# deploy/base/deviceclass-mig.yaml: MIG devices (docs/mig.md)
MIG_DEVICE_CLASS: Any = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": f"mig.{DRIVER}"},
    "spec": {"selectors": [{"cel": {"expression":
                                    f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'}}]},
}
# deploy/base/deviceclass-mps.yaml: the GPUs that serve MPS claims (sharingStrategy MPS or Mixed),
# and the config that makes a claim MPS.
MPS_SERVED = (f'"sharingStrategy" in device.attributes["{DRIVER}"] && '
              f'device.attributes["{DRIVER}"].sharingStrategy in ["MPS", "Mixed"]')
MPS_DEVICE_CLASS: Any = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": f"mps.{DRIVER}"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                           {"cel": {"expression": MPS_SERVED}}],
             "config": [{"opaque": {"driver": DRIVER, "parameters": {
                 "apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", "sharingStrategy": "MPS"}}}]},
}


def _extended_class(name: str, resource: str, sharing: str) -> Any:
    expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].sharing == "{sharing}"'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"extendedResourceName": resource, "selectors": [{"cel": {"expression": expression}},
                                                                      {"cel": {"expression": NOT_MPS_ONLY}}]}}


# The classes deploy/base/deviceclass-extended.yaml installs: pods that write
# `resources.limits: {gpushare.dev/share: 1}` (or gpushare.dev/gpu) get a device with no claim.
EXTENDED_DEVICE_CLASSES: list[Any] = [
    _extended_class(f"share.{DRIVER}", f"{DRIVER}/share", "partition"),
    _extended_class(f"gpu.{DRIVER}", f"{DRIVER}/gpu", "capacity"),
]

RUNTIMES = ("auto", "podman", "process")
# The plugin's --mps-control on simulated GPUs: the stand-in control daemon
MPS_CONTROL = (sys.executable, "-m", "playground.mpscontrol")  # the stand-in control daemon


def choose_runtime(runtime: str) -> str:
    """'auto' -> podman when it can run here (root, podman and runc), else process."""
    from .containers import PodmanRunner

    if runtime == "auto":
        return "podman" if PodmanRunner.available() is None else "process"
    return runtime


class SimulatedNode:
    """A node's kubelet plugin, kubelet sockets and container runner, all under `workdir`."""

    plugin: Plugin | None
    kubelet: Kubelet | None

    def __init__(self, name: str, mock_gpus: str, workdir: str, runtime: str, sharing_mode: SharingMode = "auto",
                 mps_gpus: str = "none", mixed_strategies: bool = False, mig_gpus: str = "none"):
        from dra_driver.hookpath import native_paths

        self.name = name
        self.mock_gpus = mock_gpus
        self.sharing_mode = sharing_mode
        self.mps_gpus, self.mixed_strategies = mps_gpus, mixed_strategies  # the plugin's --mps-gpus, --mixed-strategies
        self.mig_gpus = mig_gpus  # the plugin's --mig-gpus
        self.workdir = workdir
        self.runtime = choose_runtime(runtime)
        self.native = native_paths()
        self.hook_dir = self._install_hook()
        self.runner = self._make_runner()
        self.plugin = None
        self.kubelet = None

    @property
    def cdi_root(self) -> str:
        from .containers import PodmanRunner

        return PodmanRunner.CDI_ROOT if self.runtime == "podman" else os.path.join(self.workdir, "cdi")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.workdir, "state")

    def _install_hook(self) -> str:
        """What install-hook puts on a node: the library, and the simulated driver in sim/."""
        hook = os.path.join(self.workdir, "hook")
        os.makedirs(os.path.join(hook, "sim"), exist_ok=True)
        shutil.copy(self.native["library"], hook)
        shutil.copy(self.native["sim_cuda"], os.path.join(hook, "sim", "libcuda.so.1"))
        shutil.copy(self.native["sim_nvml"], os.path.join(hook, "sim", "libnvidia-ml.so.1"))
        return hook

    def _make_runner(self) -> PodmanRunner | ProcessRunner:
        from .containers import CONTAINER_PROBE, PodmanRunner, ProcessRunner

        if self.runtime == "podman":
            runner = PodmanRunner(self.native["probe"], (self.native["library"], self.native["sim_cuda"],
                                                         self.native["sim_nvml"]), owner=self.workdir)
            write_tools(os.path.join(runner.rootfs, "usr", "local", "bin"), CONTAINER_PROBE)
            return runner
        tools = write_tools(os.path.join(self.workdir, "bin"), self.native["probe"])
        return ProcessRunner(self.cdi_root, self.native["probe"], self.workdir, path=(tools,))

    def register(self, api: client.ApiClient) -> None:
        """The Node object and the driver's DeviceClass, as joining the cluster and installing do."""
        core = client.CoreV1Api(api)
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name}})  # type: ignore[arg-type]
        for device_class in (DEVICE_CLASS, MPS_DEVICE_CLASS, MIG_DEVICE_CLASS, *EXTENDED_DEVICE_CLASSES):
            client.ResourceV1Api(api).create_device_class(device_class)

    def start_plugin(self, api: client.ApiClient, health_recovery_seconds: float = 300.0) -> Plugin:
        from kubeletplugin.main import Plugin

        from .kubelet import Kubelet

        w = self.workdir
        config = PluginConfig(
            node_name=self.name, plugin_dir=os.path.join(w, "plugin"), registry_dir=os.path.join(w, "registry"),
            state_dir=self.state_dir, cdi_root=self.cdi_root, hook_dir=self.hook_dir, device_backend="mock",
            mock_gpus=self.mock_gpus, sharing_mode=self.sharing_mode, metrics_addr="127.0.0.1:0",
            healthcheck_port=0, health_recovery_seconds=health_recovery_seconds, mps_control=MPS_CONTROL,
            mps_gpus=self.mps_gpus, mixed_strategies=self.mixed_strategies, mig_gpus=self.mig_gpus)
        self.plugin = Plugin(config, api=api).start()
        self.kubelet = Kubelet(self.plugin.dra_socket, self.plugin.reg_socket)
        return self.plugin

    def stop_plugin(self) -> None:
        if self.kubelet:
            self.kubelet.close()
            self.kubelet = None
        if self.plugin:
            self.plugin.stop(grace=2)
            self.plugin = None

    def close(self) -> None:
        self.stop_plugin()
        self.runner.close()


def write_tools(folder: str, probe: str) -> str:
    """The commands the examples' containers run that a shell does not have, as the image has
    them: `gpushare-dra hook-path probe` and `nvidia-smi -L` (the probe lists the GPUs NVML shows)."""
    scripts = {
        "gpushare-dra": f'[ "$*" = "hook-path probe" ] && exec echo {probe}\n'
                        'echo "gpushare-dra on the playground node: only \\`hook-path probe\\`" >&2\nexit 2\n',
        "nvidia-smi": f'case "$*" in -L|--list-gpus) exec {probe} gpus;; esac\n'
                      'echo "nvidia-smi on the playground node: only -L" >&2\nexit 2\n',
    }
    os.makedirs(folder, exist_ok=True)
    for name, body in scripts.items():
        path = os.path.join(folder, name)
        Path(path).write_text("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
    return folder
