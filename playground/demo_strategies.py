"""`gpushare-dra demo --strategies`: one claim of each sharing strategy on one simulated GPU,
side by side (docs/strategies.md), each step checked, exit status 1 if any check fails:

1. an API server and a node (as `demo`);
2. the node's GPUs;
3. the kubelet plugin starts, with the stand-in MPS control daemon (no NVIDIA driver here);
4. three claims of 1Gi and 25 % of one GPU, sharingStrategy TimeSlicing, MPS and None, one pod each;
5. the kubelet prepares them: what each claim's CDI spec puts in its containers;
6. all three pods at once: a container launching kernels flat out, one allocating 768Mi twice
   (the second past the budget); what each claim held, as a table;
7. the node agent's view (what `gpushare-dra top` shows);
8. the pods end and the kubelet unprepares: nothing is left behind.

tests/agent/test_strategies_side_by_side.py makes the same measurements on the agent suite's node.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from dra_driver.quantity import format_bytes
from kubeletplugin.claimref import ClaimRef
from kubeletplugin.hooklayout import SIM_MPS_HELD

from .claims import DRIVER
from .containers import Workload, cgroup_mount, parse_kv
from .demo import NAMESPACE, NODE, Demo, Story

GiB, MiB = 1 << 30, 1 << 20
STRATEGIES = ("TimeSlicing", "MPS", "None")
BUDGET, SHARE = GiB, 25
KERNEL_US = 200  # short against the simulated GPU's 2.5 ms time slice
SECONDS = 4
CHUNK = 768 * MiB  # the first fits the 1Gi budget, the second does not
COMPUTE_TOLERANCE = 0.05
KILL_BOUND_S = 5.0  # the promise is 200 ms (docs/security.md); this leaves room for a loaded machine


def _claim_body(name: str, strategy: str) -> Any:  # a body: see node.DEVICE_CLASS
    params = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", "sharingStrategy": strategy}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {
                    "memory": format_bytes(BUDGET), "compute": str(SHARE)}}}}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": params}}]}}}


def _pod_body(name: str, claim: str) -> Any:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": c, "image": "gpushare-probe", "resources": {"claims": [{"name": "gpu"}]}}
                                    for c in ("launch", "alloc")]}}


def throughput(out: dict[str, str]) -> float:
    """GPU work done within the launch window, as a fraction of the GPU's solo speed"""
    return int(out["done_in_window"]) * KERNEL_US / 1e6 / float(out["window_s"])


class StrategiesDemo(Demo):
    # one claim of each strategy on one GPU: the operator's choice to mix them (docs/strategies.md)
    mixed_strategies = True

    def __init__(self, mock_gpus: str, workdir: str, runtime: str):
        super().__init__(mock_gpus, workdir, runtime)
        self.story = Story(8)
        self.pod_uids: dict[str, str] = {}  # strategy -> its pod's UID
        self.ids: dict[str, list[str]] = {}  # strategy -> its CDI device IDs
        self.injected: dict[str, bool] = {}  # strategy -> its spec preloads the library
        self.in_pods = False  # its containers run in their pods' cgroups
        self.metrics: dict = {}  # the plugin's, while the pods ran

    def run(self) -> int:
        return self.run_steps([self.api_server, self.gpus, self.plugin_starts, self.three_claims, self.prepare_three,
                               self.side_by_side, self.agent_view, self.unprepare],
                              "three claims on one GPU, each held by its strategy.")

    def three_claims(self):
        from .allocator import allocate_and_reserve

        s = self.story
        s.step("Three claims on one GPU, one per sharing strategy", f"Each asks for {format_bytes(BUDGET)} and "
               f"{SHARE} % of a GPU and names its sharingStrategy in its GpuShareConfig; one pod each "
               "(containers launch and alloc).")
        api = self.emu.api_client()
        rapi, core = client.ResourceV1Api(api), client.CoreV1Api(api)
        devices = set()
        for strategy in STRATEGIES:
            name = strategy.lower()
            created = rapi.create_namespaced_resource_claim(NAMESPACE, _claim_body(name, strategy))
            pod = core.create_namespaced_pod(NAMESPACE, _pod_body(f"{name}-pod", name))
            claim = allocate_and_reserve(api, NAMESPACE, name, NODE, pod=api.sanitize_for_serialization(pod))
            self.claims[strategy] = ClaimRef(NAMESPACE, name, created.metadata.uid)
            self.uids.add(created.metadata.uid)
            self.pod_uids[strategy] = pod.metadata.uid
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            devices.add(result["device"])
            s.show(f"claim {name}: sharingStrategy {strategy}, device {result['device']}, "
                   f"consumed {result.get('consumedCapacity')}")
        s.check(len(devices) == 1, "all three on one GPU", ", ".join(sorted(devices)))

    def prepare_three(self):
        s = self.story
        s.step("The kubelet prepares them", "What each claim's CDI spec puts in its containers: TimeSlicing the "
               "library, paced to the share; MPS the library for memory and the GPU's MPS pipe folder; None "
               "nothing of ours.")
        for strategy, claim in self.claims.items():
            answer = self.kubelet.prepare(claim).claims[claim.uid]
            s.check(answer.error == "", f"{claim.name} prepared", answer.error)
            self.ids[strategy] = [i for d in answer.devices for i in d.cdi_device_ids]
            spec = json.loads((Path(self.cdi_root) / f"k8s.gpushare.dev-claim_{claim.uid}.json").read_text())
            env = dict(e.split("=", 1) for e in spec["containerEdits"].get("env") or [])
            limits = Path(self.workdir, "state", "claims", claim.uid, "limits")
            compute = next((line.split("=", 1)[1] for line in limits.read_text().splitlines()
                            if line.startswith("GPUSHARE_COMPUTE_LIMIT_0=")), "-") if limits.exists() else None
            s.show(f"{claim.name}: LD_PRELOAD {'yes' if 'LD_PRELOAD' in env else 'no'}, limits file "
                   + (f"compute {compute}" if compute else "none")
                   + (f", MPS pipe {env['CUDA_MPS_PIPE_DIRECTORY']} at "
                      f"{env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')} %" if "CUDA_MPS_PIPE_DIRECTORY" in env else ""))
            self.injected[strategy] = "LD_PRELOAD" in env
        s.check(self.injected == {"TimeSlicing": True, "MPS": True, "None": False},
                "the library goes into TimeSlicing and MPS containers, nothing into None's")

    def _start(self, strategy: str, container: str, argv: list[str]) -> Workload:
        parent = f"/kubepods/pod{self.pod_uids[strategy]}" if self.in_pods else None
        w = self.runner.start(f"{strategy.lower()}-{container}", self.ids[strategy], argv, cgroup_parent=parent)
        self.workloads.append(w)
        return w

    def side_by_side(self):
        s = self.story
        # the backstop finds a None claim's processes by their pod's cgroup (nothing of ours is in
        # them): podman puts a container there, host processes get there only as root
        self.in_pods = self.runner.kind == "podman" or (os.geteuid() == 0 and cgroup_mount() is not None)
        s.step("All three pods at once", f"Container launch runs {KERNEL_US} us kernels flat out for {SECONDS}s; "
               f"container alloc asks for {format_bytes(CHUNK)} twice, the second past the budget.")
        launch = {st: self._start(st, "launch", ["launch", "--seconds", str(SECONDS), "--kernel-us", str(KERNEL_US),
                                                 "--grid", "132"])  # the whole GPU's SMs
                  for st in STRATEGIES}
        alloc_argv = ["alloc", "--chunk", str(CHUNK), "--max", str(2 * CHUNK), "--hold", str(SECONDS + 2)]
        time.sleep(0.5)  # the launches under way
        alloc = {st: self._start(st, "alloc", alloc_argv) for st in ("TimeSlicing", "MPS")}
        held = {st: w.read_until("allocated=", timeout=60) for st, w in alloc.items()}
        info: dict[str, dict[str, str]] = {}
        for st in ("TimeSlicing", "MPS"):
            w = self._start(st, "meminfo", ["meminfo"])
            for line in w.wait(timeout=60):
                info.setdefault(st, {}).update(parse_kv(line))
        alloc["None"] = self._start("None", "alloc", alloc_argv)
        past = alloc["None"].read_until("step=1", timeout=60)
        seen = time.monotonic()
        killed = None
        if self.in_pods:
            try:
                alloc["None"].proc.wait(timeout=30)
                killed = time.monotonic() - seen
            except subprocess.TimeoutExpired:  # not killed: the check below says so
                pass
        self.metrics = self._settled_metrics()  # for the next step, while they hold their memory
        outs = {st: w.read_until("launches=", timeout=60) for st, w in launch.items()}
        share = {st: throughput(o) for st, o in outs.items()}
        for st in ("TimeSlicing", "MPS"):
            alloc[st].wait(timeout=60)

        rows = [("CLAIM", "COMPUTE", "KERNEL", "LIBRARY", f"2ND {format_bytes(CHUNK)}", "cuMemGetInfo TOTAL",
                 "BACKSTOP")]
        for st in STRATEGIES:
            second = (f"{held[st]['result']}, holds {format_bytes(int(held[st]['allocated']))}" if st in held
                      else f"rc={past['rc']}, {format_bytes(int(past['allocated']))} in all")
            rows.append((st.lower(), f"{share[st]:.1%}", f"{float(outs[st]['kernel_us']):.0f} us",
                         "yes" if self.injected[st] else "no", second,
                         format_bytes(int(info[st]["cu_total"])) if st in info else "-",
                         f"killed it in {killed * 1000:.0f} ms" if st == "None" and killed is not None else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        s.show("\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows))

        ts, mps = share["TimeSlicing"], share["MPS"]
        s.check(abs(ts - SHARE / 100) <= COMPUTE_TOLERANCE, f"timeslicing: GPU time within 5 points of {SHARE} %, "
                "beside two contexts nothing paces", f"{ts:.1%}")
        held_us = KERNEL_US * 100 / SHARE / SIM_MPS_HELD  # a whole-GPU kernel on the share's SMs
        s.check(abs(float(outs["MPS"]["kernel_us"]) - held_us) <= 0.1 * held_us,
                f"mps: an MPS client of the GPU's server, its kernels on the server's {SHARE} % of the SMs",
                f"a {KERNEL_US} us kernel took {float(outs['MPS']['kernel_us']):.0f} us")
        s.show(f"mps: {mps:.1%} of the GPU's work: its server is one context in the GPU's time slicing, so its "
               f"clients run only while it holds the GPU ({1 - ts - share['None']:.0%} of the time here), "
               f"at {SHARE} % of the SMs")
        for st in ("TimeSlicing", "MPS"):
            s.check((held[st]["result"], int(held[st]["allocated"])) == ("oom", CHUNK),
                    f"{st.lower()}: the allocation past the budget failed with CUDA_ERROR_OUT_OF_MEMORY")
            s.check(alloc[st].proc.returncode == 0 and alloc[st].lines[-1] == "freed=1 free_errors=0",
                    f"{st.lower()}: its container went on, freed what it held and ended well")
            s.check(int(info[st]["cu_total"]) == BUDGET, f"{st.lower()}: cuMemGetInfo shows the 1Gi budget")
        s.check(past["rc"] == "0", "none: nothing refused the allocation past the budget",
                f"{format_bytes(int(past['allocated']))} held")
        s.show(f"none: {share['None']:.1%} of the GPU's work: nothing holds a None claim to its compute share")
        if not self.in_pods:
            s.show("none: the backstop finds a None claim's processes by their pod's cgroup; host processes "
                   "outside one cannot be told apart (run as root, or with podman, to see it kill)")
            return
        s.check(killed is not None and killed < KILL_BOUND_S and alloc["None"].proc.returncode != 0,
                "none: the backstop killed the container that held more than the budget",
                f"in {killed * 1000:.0f} ms" if killed is not None else "still running")
        mine = self._backstop_events(self.claims["None"].uid)
        deadline = time.monotonic() + 10  # Events go out on the backstop's own thread
        while not mine and time.monotonic() < deadline:
            time.sleep(0.2)
            mine = self._backstop_events(self.claims["None"].uid)
        if mine:
            s.show(f"Event on claim none: {mine[0].type} {mine[0].reason}: {mine[0].message}")
        s.check(bool(mine), "none: a Warning Event on the claim says so")

    def _backstop_events(self, uid: str) -> list:
        events = client.CoreV1Api(self.emu.api_client()).list_namespaced_event(NAMESPACE).items
        return [e for e in events if e.reason == "GpuMemoryLimitExceeded" and e.involved_object.uid == uid]

    def _settled_metrics(self):
        """The plugin's metrics once the agent has sampled NVML since the allocations (a few seconds at most)."""
        from dra_driver import top

        def settled(metrics):
            nvml = metrics.get("gpushare_claim_memory_nvml_bytes", {})
            return sorted(v for (_, claim, _), v in nvml.items() if claim in ("timeslicing", "mps")) == [CHUNK] * 2

        url = f"http://127.0.0.1:{self.plugin.metrics_port}/metrics"
        metrics = top.scrape(url)
        deadline = time.monotonic() + 5
        while not settled(metrics) and time.monotonic() < deadline:
            time.sleep(0.2)
            metrics = top.scrape(url)
        return metrics

    def agent_view(self):
        from dra_driver import top

        s = self.story
        s.step("The node agent's view", "The plugin's /metrics while the pods ran, as `gpushare-dra top` shows "
               "them: each claim's strategy, limits and use (RATE: the pacing rate, in GPU time for "
               "TimeSlicing and in SM-time for MPS; a None claim has none).")
        metrics = self.metrics
        s.show(top.frame(metrics))
        strategies = {key[1]: v for key, v in metrics.get("gpushare_claim_sharing_strategy", {}).items()}
        s.check(strategies == {st.lower(): st for st in STRATEGIES}, "SHARING names each claim's strategy")
        held = {key[1]: v for key, v in metrics.get("gpushare_claim_memory_used_bytes", {}).items()}
        s.check(held.get("timeslicing") == held.get("mps") == CHUNK,
                f"MEM USED: the {format_bytes(CHUNK)} each library let through")
        if self.in_pods:
            kills = {key[1]: v for key, v in metrics.get("gpushare_claim_backstop_kills_total", {}).items()}
            s.check(kills.get("none", 0) >= 1 and not kills.get("timeslicing") and not kills.get("mps"),
                    "the backstop's kills: none's only", f"{kills}")
