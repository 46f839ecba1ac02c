"""`gpushare-dra playground`: a one-node cluster on this machine that runs what kubectl applies.

Beside the API emulator: the resourceclaim controller (claims from templates, reservations
released, claims deallocated), the scheduler (claims allocated and reserved, pods bound) and
the node (the real kubelet plugin on simulated GPUs, and the kubelet's pod lifecycle running
containers with their CDI devices). Each control loop is a thread that looks at the whole
cluster every POLL_S seconds, as a level-triggered controller does on a resync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
from collections.abc import Callable

from dra_driver.log import get_logger
from dra_driver.runloop import serve
from kubeletplugin.claimfiles import unmount_all_regions

POLL_S = 0.2
log = get_logger("playground")


class ControlLoop:
    """sync() every POLL_S seconds in a thread until stop(); a failed pass is logged and retried."""

    def __init__(self, name: str, sync: Callable[[], None]):
        self.name = name
        self.sync = sync
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_error = ""
        while not self._stop.wait(POLL_S):
            try:
                self.sync()
                last_error = ""
            except Exception as e:  # a pass that failed (an API error, a race): the next one retries
                if str(e) != last_error:  # once per distinct failure, not five times a second
                    log.warning("control loop pass failed", loop=self.name, error=f"{type(e).__name__}: {e}")
                last_error = str(e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class Playground:
    def __init__(self, args: argparse.Namespace, version: str | None, workdir: str):
        from .claimcontroller import ResourceClaimController
        from .emulator.__main__ import start_emulator
        from .node import SimulatedNode
        from .podsync import PodSync
        from .scheduler import Scheduler

        self.workdir = workdir
        self.loops: list[ControlLoop] = []
        self.emulator = start_emulator(args, version)
        self.node: SimulatedNode | None = None
        self.pods: PodSync | None = None
        try:
            api = self.emulator.api_client()
            self.node = SimulatedNode(args.node_name, args.mock_gpus, workdir, args.runtime, args.sharing_mode,
                                      mps_gpus=args.mps_gpus, mixed_strategies=args.mixed_strategies,
                                      mig_gpus=args.mig_gpus)
            self.node.register(api)
            plugin = self.node.start_plugin(api, args.health_recovery_seconds)
            if plugin.slices is not None and not plugin.slices.wait_synced(30):
                raise RuntimeError("the kubelet plugin published no ResourceSlices in 30 s")
            self.pods = PodSync(api, self.node)
            self.emulator.pod_logs = self.pods.logs
            self.loops = [ControlLoop("resourceclaim-controller", ResourceClaimController(api).sync),
                          ControlLoop("scheduler", Scheduler(api, self.node.name).sync),
                          ControlLoop("kubelet", self.pods.sync)]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()
        if self.pods is not None:
            self.pods.close()  # containers stopped, claims unprepared
        if self.node is not None:
            self.node.close()
        self.emulator.stop()


def run(args: argparse.Namespace) -> int:
    from dra_driver.discovery import MockBackend

    from .emulator.__main__ import check_flags

    MockBackend(args.mock_gpus)  # a bad --mock-gpus is the CLI's one-line error, before anything starts
    version = check_flags(args)
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpushare-playground-")
    os.makedirs(workdir, exist_ok=True)

    def start() -> Playground:
        playground = Playground(args, version, workdir)
        if args.kubeconfig_out:  # written last: its presence says the cluster is ready
            playground.emulator.write_kubeconfig(args.kubeconfig_out)
        assert playground.node is not None
        log.info("playground serving", url=playground.emulator.url, kubeconfig=args.kubeconfig_out,
                 node=playground.node.name, gpus=args.mock_gpus, runtime=playground.node.runtime, workdir=workdir)
        return playground

    try:
        return serve(start, log, "playground stopping")
    finally:
        if not args.workdir:
            unmount_all_regions(os.path.join(workdir, "state"))  # claims its node left prepared
            shutil.rmtree(workdir, ignore_errors=True)
