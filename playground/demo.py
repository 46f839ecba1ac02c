"""`gpushare-dra demo`: the whole product on one screen, with no cluster and no GPU.

The story (docs/contract.md, "Local run"), each step checked, exit status 1 if any check fails:

 1. an API server (the in-process emulator, DRAConsumableCapacity on) and a node;
 2. the node's GPUs (mock backend; the simulated CUDA driver stands in for the real one);
 3. the kubelet plugin starts, registers, and publishes the node's ResourceSlices;
 4. a workload author's claim (4Gi, 30 % of a GPU) shared by two pods of two containers;
 5. the claim is allocated (the allocation stand-in does what kube-scheduler does);
 6. the kubelet prepares it for the first pod: a CDI spec with the library and limits;
 7. the first pod's containers allocate GPU memory;
 8. the plugin restarts; the kubelet prepares the claim for the second pod: same answer;
 9. the second pod's containers hit the claim's shared budget: out of memory, others unharmed;
10. memory queries inside show the claim's limit, not the GPU's;
11. a second claim on the same GPU keeps its own budget;
12. kernel launches are paced to the claim's compute share;
13. the node agent reports each claim's use (what `gpushare-dra top` shows);
14. the pods end and the kubelet unprepares: nothing is left behind.

The same scenario is the end-to-end test (tests/e2e), which requires podman. `--strategies`
runs another story: one claim of each sharing strategy on one GPU (demo_strategies.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from dra_driver.devicemodel import whole_gpu_device
from dra_driver.quantity import format_bytes
from kubeletplugin.claimref import ClaimRef

from .claims import DRIVER
from .containers import Workload, parse_kv
from .devicehealth import advertises_health
from .node import SimulatedNode

if TYPE_CHECKING:  # imported where used: `demo --help` stays quick
    from kubeletplugin.main import Plugin

    from .containers import PodmanRunner, ProcessRunner
    from .emulator import ApiEmulator
    from .kubelet import Kubelet

GiB = 1 << 30
MiB = 1 << 20
NODE = "demo-node"
NAMESPACE = "default"
CLAIM_MEMORY, CLAIM_COMPUTE = 4 * GiB, 30
SECOND_CLAIM_MEMORY, SECOND_CLAIM_COMPUTE = 2 * GiB, 20
CHUNK = 512 * MiB
PER_CONTAINER_ASK = 1536 * MiB  # four containers asking 1.5Gi each: 6Gi against a 4Gi budget
PACING_SECONDS = 2.0
PACING_TOLERANCE = 0.05


class Story:
    """Prints each step and what it shows; remembers whether every check held."""

    def __init__(self, steps: int):
        self.steps, self.n = steps, 0
        self.failures: list[str] = []

    def step(self, title: str, why: str) -> None:
        self.n += 1
        print(f"\n[{self.n}/{self.steps}] {title}\n      {why}", flush=True)

    def show(self, text: str) -> None:
        for line in text.splitlines():
            print(f"      {line}", flush=True)

    def check(self, ok: bool, claim: str, detail: str = "") -> bool:
        mark = "ok  " if ok else "FAIL"
        print(f"      {mark} {claim}" + (f" ({detail})" if detail else ""), flush=True)
        if not ok:
            self.failures.append(claim)
        return ok


def _claim_body(name: str, memory: int, compute: int) -> Any:  # a body: see node.DEVICE_CLASS
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": format_bytes(memory), "compute": str(compute)}}}}]}}}


def _pod_body(name: str, claim: str, containers: list[str]) -> Any:  # a body: see node.DEVICE_CLASS
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": c, "image": "gpushare-probe", "resources": {"claims": [{"name": "gpu"}]}}
                                    for c in containers]}}


class Demo:
    mixed_strategies = False  # the plugin's --mixed-strategies (the strategies demo puts all three on one GPU)
    # Each set by its step; None until then (mypy: strict_optional is off for this module).
    emu: ApiEmulator
    node: SimulatedNode
    workloads: list[Workload]

    def __init__(self, mock_gpus: str, workdir: str, runtime: str):
        self.mock_gpus = mock_gpus
        self.workdir = workdir
        self.runtime = runtime
        self.story = Story(14)
        self.emu = None
        self.node = None
        self.workloads = []
        self.claims: dict[str, ClaimRef] = {}  # prepared or to prepare, by name
        self.uids: set[str] = set()  # every claim the demo made, for the leftovers check
        self.answers: dict[str, list] = {}

    # ---- infrastructure: the node's (node.py) ------------------------------------------------

    @property
    def plugin(self) -> Plugin:
        return self.node.plugin

    @property
    def kubelet(self) -> Kubelet:
        return self.node.kubelet

    @property
    def runner(self) -> PodmanRunner | ProcessRunner:
        return self.node.runner

    @property
    def cdi_root(self) -> str:
        return self.node.cdi_root

    def close(self):
        for w in self.workloads:
            w.stop()
        if self.node:
            for claim in self.claims.values():
                if self.kubelet:
                    self.kubelet.unprepare(claim)
            self.node.close()
        if self.emu:
            self.emu.stop()

    # ---- the story --------------------------------------------------------------------------

    def run(self) -> int:
        return self.run_steps([self.api_server, self.gpus, self.plugin_starts, self.author_claim, self.allocate,
                               self.prepare_first_pod, self.first_pod_runs, self.restart_and_prepare_second_pod,
                               self.second_pod_hits_budget, self.memory_queries, self.second_claim, self.pacing,
                               self.telemetry, self.unprepare],
                              "one claim, shared by four containers in two pods, held to one budget.")

    def run_steps(self, steps: list[Callable[[], None]], behaved: str) -> int:
        """Each step in turn, then what the checks said; the exit status."""
        s = self.story
        try:
            for step in steps:
                step()
        except Exception as e:  # a step that could not even run is a failed step, said plainly
            s.check(False, f"step {s.n} ran to the end", f"{type(e).__name__}: {e}")
        finally:
            self.close()
        if s.failures:
            print(f"\nThe demo FAILED {len(s.failures)} check(s): " + "; ".join(s.failures))
            return 1
        print(f"\nEvery step behaved: {behaved}")
        return 0

    def api_server(self):
        from .emulator import ApiEmulator

        s = self.story
        s.step("A Kubernetes API server", "The in-process emulator speaks the real REST and watch protocol; "
               "DRAConsumableCapacity is on, as on a cluster with that feature gate.")
        self.emu = ApiEmulator(consumable_capacity=True).start()
        self.node = SimulatedNode(NODE, self.mock_gpus, self.workdir, self.runtime,
                                  mixed_strategies=self.mixed_strategies)
        self.node.register(self.emu.api_client())
        s.show(f"API server {self.emu.url}; node {NODE}; DeviceClass {DRIVER} (device.driver == \"{DRIVER}\")")

    def gpus(self):
        from dra_driver.discovery import make_backend

        s = self.story
        s.step("The node's GPUs", "Simulated GPUs (--device-backend mock) with the identities the simulated "
               "CUDA driver reports, so limits find their device by UUID.")
        gpus = make_backend("mock", self.mock_gpus).discover()
        for g in gpus:
            s.show(f"{whole_gpu_device(g.index)}: {g.product_name}, {format_bytes(g.memory_bytes)}, {g.uuid}")
        self.gpu_memory = gpus[0].memory_bytes
        s.show(f"containers run with: {self.runner.kind}"
               + ("" if self.runner.kind == "podman" else " (the CDI spec applied to host processes; "
                  "podman + runc as root would run real containers)"))

    def plugin_starts(self):
        s = self.story
        s.step("The kubelet plugin starts", "It registers with the kubelet and publishes the node's GPUs as "
               "ResourceSlices: in capacity mode each GPU is one device whose memory and compute claims consume.")
        self.node.start_plugin(self.emu.api_client())
        info = self.kubelet.get_info()
        s.check(info.type == "DRAPlugin" and info.name == DRIVER and "v1.DRAPlugin" in info.supported_versions
                and advertises_health(info.supported_versions), "registration answers as the kubelet expects "
                "(the DRA service v1, a device health service)", f"{info.name} at {info.endpoint}")
        synced = self.plugin.slices is not None and self.plugin.slices.wait_synced(20)
        s.check(synced, "ResourceSlices published")
        slices = client.ResourceV1Api(self.emu.api_client()).list_resource_slice(
            field_selector=f"spec.driver={DRIVER}").items
        devices = [d for sl in slices for d in sl.spec.devices or []]
        for d in devices:
            cap = d.capacity or {}
            s.show(f"{d.name}: memory {cap['memory'].value}, compute {cap['compute'].value}, "
                   f"allowMultipleAllocations={d.allow_multiple_allocations}")
        s.check(self.plugin.slices.mode == "capacity" and all(d.allow_multiple_allocations for d in devices),
                "capacity mode: GPUs are shared by consumable capacity", f"mode={self.plugin.slices.mode}")

    def author_claim(self):
        s = self.story
        s.step("A workload author's claim", "ResourceClaim shared-gpu asks for 4Gi and 30 % of one GPU; pods "
               "trainer-a and trainer-b (two containers each) use it.")
        rapi = client.ResourceV1Api(self.emu.api_client())
        core = client.CoreV1Api(self.emu.api_client())
        claim = rapi.create_namespaced_resource_claim(NAMESPACE, _claim_body("shared-gpu", CLAIM_MEMORY, CLAIM_COMPUTE))
        self.claims["shared-gpu"] = ClaimRef(NAMESPACE, "shared-gpu", claim.metadata.uid)
        self.uids.add(claim.metadata.uid)
        self.pods = {p: core.create_namespaced_pod(NAMESPACE, _pod_body(p, "shared-gpu", [f"{p[-1]}1", f"{p[-1]}2"]))
                     for p in ("trainer-a", "trainer-b")}
        s.show(f"claim uid {claim.metadata.uid}")

    def allocate(self):
        from .allocator import allocate_and_reserve

        s = self.story
        s.step("The scheduler allocates the claim", "The allocation stand-in does what kube-scheduler's DRA "
               "allocator does: class selector (CEL), capacity rounded by the device's requestPolicy, a shareID.")
        api = self.emu.api_client()
        for pod in self.pods.values():
            claim = allocate_and_reserve(api, NAMESPACE, "shared-gpu", NODE, pod=api.sanitize_for_serialization(pod))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        self.shared_device = result["device"]
        s.show(f"device {result['device']}, consumed {result.get('consumedCapacity')}, shareID {result.get('shareID')}")
        s.check(result.get("consumedCapacity") == {"memory": "4Gi", "compute": "30"},
                "the claim consumes 4Gi and 30 of the GPU's capacity")
        s.check(len(claim["status"].get("reservedFor") or []) == 2, "reserved for both pods")

    def prepare_first_pod(self):
        s = self.story
        s.step("The kubelet prepares the claim for trainer-a", "NodePrepareResources writes a CDI spec that "
               "mounts libgpushare.so, preloads it, and carries the claim's limits.")
        claim = self.claims["shared-gpu"]
        answer = self.kubelet.prepare(claim).claims[claim.uid]
        s.check(answer.error == "", "prepared", answer.error)
        self.answers["shared-gpu"] = [list(d.cdi_device_ids) for d in answer.devices]
        ids = self.answers["shared-gpu"][0]
        s.show(f"CDI devices: {', '.join(ids)}")
        spec_path = Path(self.cdi_root) / f"k8s.gpushare.dev-claim_{claim.uid}.json"
        s.check(spec_path.exists(), "CDI spec written", str(spec_path))
        limits = Path(self.workdir, "state", "claims", claim.uid, "limits").read_text()
        s.show("limits file (read-only in every container):\n" +
               "\n".join("  " + line for line in limits.splitlines() if not line.startswith("#")))
        s.check(f"GPUSHARE_MEMORY_LIMIT_0={CLAIM_MEMORY}" in limits and
                f"GPUSHARE_COMPUTE_LIMIT_0={CLAIM_COMPUTE}" in limits, "limits are the allocation's 4Gi / 30 %")

    def _alloc(self, name: str, claim: str, ask: int):
        w = self.runner.start(name, self.answers[claim][0],
                              ["alloc", "--chunk", str(CHUNK), "--max", str(ask), "--hold", "600"])
        self.workloads.append(w)
        result = w.read_until("allocated=")
        return w, int(result["allocated"]), result["result"]

    def first_pod_runs(self):
        s = self.story
        s.step("trainer-a's containers allocate", "Each asks for 1.5Gi in 512Mi steps and holds it.")
        self.held = {}
        for c in ("a1", "a2"):
            w, got, result = self._alloc(c, "shared-gpu", PER_CONTAINER_ASK)
            self.held[c] = (w, got)
            s.check(got == PER_CONTAINER_ASK, f"container {c} got {format_bytes(got)}", f"result={result}")

    def restart_and_prepare_second_pod(self):
        s = self.story
        s.step("The plugin restarts, then the kubelet prepares the claim for trainer-b",
               "A second Prepare of a prepared claim returns the identical answer and leaves the usage "
               "region alone, so trainer-a's processes keep sharing one budget with trainer-b's.")
        claim = self.claims["shared-gpu"]
        region = Path(self.workdir, "state", "claims", claim.uid, "region", "0")
        before = (region.stat().st_ino, region_used(region))
        self.node.stop_plugin()
        self.node.start_plugin(self.emu.api_client())
        answer = self.kubelet.prepare(claim).claims[claim.uid]
        s.check(answer.error == "" and [list(d.cdi_device_ids) for d in answer.devices] == self.answers["shared-gpu"],
                "the same CDI devices after the restart")
        after = (region.stat().st_ino, region_used(region))
        s.check(after == before and after[1] == 2 * PER_CONTAINER_ASK,
                "the usage region is the same file and still holds trainer-a's 3Gi",
                f"{format_bytes(after[1])} in use")

    def second_pod_hits_budget(self):
        s = self.story
        s.step("trainer-b's containers hit the claim's budget", "3Gi of the 4Gi are in use by trainer-a; "
               "together the four containers cannot pass 4Gi.")
        got = {}
        for c in ("b1", "b2"):
            w, amount, result = self._alloc(c, "shared-gpu", PER_CONTAINER_ASK)
            self.held[c] = (w, amount)
            got[c] = (amount, result)
            s.show(f"container {c}: got {format_bytes(amount)}, then {result}")
        total = sum(amount for _, amount in self.held.values())
        s.check(total == CLAIM_MEMORY, "the four containers together hold exactly the 4Gi budget",
                f"{format_bytes(total)}")
        s.check(got["b1"][1] == "oom" and got["b2"][1] == "oom",
                "the allocations that would pass it failed with CUDA_ERROR_OUT_OF_MEMORY")
        s.check(all(w.running() for w, _ in self.held.values()), "every container keeps running")

    def memory_queries(self):
        s = self.story
        s.step("Memory queries inside show the claim's limit", "cuMemGetInfo and NVML report 4Gi total, not "
               f"the GPU's {format_bytes(self.gpu_memory)}; free is what the claim has left.")
        w = self.runner.start("b3", self.answers["shared-gpu"][0], ["meminfo"])
        self.workloads.append(w)
        w.wait()
        info = {}
        for line in w.lines:
            info.update(parse_kv(line))
        s.show(f"cuMemGetInfo: total {info.get('cu_total')} free {info.get('cu_free')}; "
               f"NVML: total {info.get('nvml_total')} used {info.get('nvml_used')}")
        s.check(info.get("cu_total") == str(CLAIM_MEMORY) and info.get("nvml_total") == str(CLAIM_MEMORY),
                "total = the claim's 4Gi")
        s.check(info.get("cu_free") == "0", "free = 0: the claim's budget is used up")

    def second_claim(self):
        from .allocator import allocate_and_reserve

        s = self.story
        s.step("A second claim on the same GPU keeps its own budget", "Claim other-team (2Gi, 20 %) lands on "
               "the same GPU; the first claim being full does not touch it.")
        api = self.emu.api_client()
        rapi = client.ResourceV1Api(api)
        core = client.CoreV1Api(api)
        created = rapi.create_namespaced_resource_claim(NAMESPACE, _claim_body("other-team", SECOND_CLAIM_MEMORY,
                                                                               SECOND_CLAIM_COMPUTE))
        pod = core.create_namespaced_pod(NAMESPACE, _pod_body("other-pod", "other-team", ["c1"]))
        claim = allocate_and_reserve(api, NAMESPACE, "other-team", NODE, pod=api.sanitize_for_serialization(pod))
        ref = ClaimRef(NAMESPACE, "other-team", created.metadata.uid)
        self.claims["other-team"] = ref
        self.uids.add(ref.uid)
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        s.check(device == self.shared_device, f"allocated on the same GPU ({device})")
        answer = self.kubelet.prepare(ref).claims[ref.uid]
        s.check(answer.error == "", "prepared", answer.error)
        self.answers["other-team"] = [list(d.cdi_device_ids) for d in answer.devices]
        _, got, result = self._alloc("c1", "other-team", 4 * GiB)  # keeps holding, as trainer-a's do
        s.check(got == SECOND_CLAIM_MEMORY and result == "oom",
                f"other-team got its {format_bytes(got)}, then {result}")

    def pacing(self):
        s = self.story
        s.step("Kernel launches are paced to the claim's compute share", f"A container of shared-gpu "
               f"launches kernels for {PACING_SECONDS:g}s; the library holds its GPU time near 30 %.")
        w = self.runner.start("a3", self.answers["shared-gpu"][0], ["launch", "--seconds", str(PACING_SECONDS)])
        self.workloads.append(w)
        result = w.read_until("launches=", timeout=60)
        share = float(result["busy_share"]) / 100  # the probe prints percent
        s.show(f"{result['launches']} launches, GPU busy {share:.1%} of the time")
        s.check(abs(share - CLAIM_COMPUTE / 100) <= PACING_TOLERANCE, "GPU time within 5 points of 30 %",
                f"{share:.1%}")

    def telemetry(self):
        from dra_driver import top

        s = self.story
        s.step("The node agent reports each claim's use", "The plugin's /metrics (what `gpushare-dra top` "
               "shows): limits, memory in use from the usage regions, refusals, time spent paced.")
        uuid = Path(self.workdir, "state", "claims", self.claims["shared-gpu"].uid, "limits").read_text()
        uuid = next(line.split("=", 1)[1] for line in uuid.splitlines() if line.startswith("GPUSHARE_DEVICE_UUID_0="))
        url = f"http://127.0.0.1:{self.plugin.metrics_port}/metrics"

        def claim_metric(metrics, name, claim):
            return metrics.get(name, {}).get((NAMESPACE, claim, uuid)) or 0

        def held(metrics, source):  # bytes the claims hold on GPU 0, by the regions or by NVML
            return sum(v for (_, _, gpu), v in metrics.get(f"gpushare_claim_memory_{source}_bytes", {}).items()
                       if gpu == uuid)

        def gpu_used(metrics):
            return metrics.get("gpushare_gpu_memory_used_bytes", {}).get((uuid, "0"))

        both = CLAIM_MEMORY + SECOND_CLAIM_MEMORY

        def settled(metrics):  # the agent has sampled NVML since other-team's container allocated
            return gpu_used(metrics) == both and held(metrics, "nvml") == both

        metrics = top.scrape(url)
        deadline = time.monotonic() + 15
        while not settled(metrics) and time.monotonic() < deadline:
            time.sleep(0.2)
            metrics = top.scrape(url)
        s.show(top.frame(metrics))
        gpu_total = metrics.get("gpushare_gpu_memory_total_bytes", {}).get((uuid, "0"))
        s.check(gpu_total == self.gpu_memory, "the agent's NVML sees the node's GPU as it is",
                f"{format_bytes(int(gpu_total or 0))} total")
        s.check(claim_metric(metrics, "gpushare_claim_memory_limit_bytes", "shared-gpu") == CLAIM_MEMORY,
                "memory limit 4Gi")
        s.check(claim_metric(metrics, "gpushare_claim_memory_used_bytes", "shared-gpu") == CLAIM_MEMORY,
                "memory used 4Gi: the four containers")
        s.check(held(metrics, "used") == gpu_used(metrics) == both,
                "the tables agree: the GPU's used memory (NVML) = what the claims hold (6Gi)",
                f"GPU {top.human_bytes(gpu_used(metrics) or 0)}, claims {top.human_bytes(held(metrics, 'used'))}")
        s.check(all(claim_metric(metrics, "gpushare_claim_memory_nvml_bytes", c) ==
                    claim_metric(metrics, "gpushare_claim_memory_used_bytes", c) for c in ("shared-gpu", "other-team")),
                "NVML MEM per claim = its MEM USED", f"NVML {top.human_bytes(held(metrics, 'nvml'))} in all")
        refusals = claim_metric(metrics, "gpushare_claim_oom_refusals_total", "shared-gpu")
        s.check(refusals >= 2, "the refused allocations are counted", f"{refusals:.0f} refusals")
        paced = claim_metric(metrics, "gpushare_claim_paced_seconds_total", "shared-gpu")
        s.check(paced > 0, "time spent paced is counted", f"{paced:.1f}s")

    def unprepare(self):
        s = self.story
        s.step("The pods end; the kubelet unprepares", "NodeUnprepareResources removes the CDI spec, the limits "
               "file and the usage regions.")
        for w in self.workloads:
            w.stop()
        self.workloads.clear()
        for name, claim in list(self.claims.items()):
            answer = self.kubelet.unprepare(claim).claims[claim.uid]
            s.check(answer.error == "", f"{name} unprepared", answer.error)
            del self.claims[name]
        left = list(Path(self.workdir, "state", "claims").glob("*"))
        specs = [p for p in Path(self.cdi_root).glob("k8s.gpushare.dev-claim_*") if p.stem.split("_")[-1] in self.uids]
        s.check(not left and not specs, "no claim files and no CDI spec left behind",
                f"{len(left)} claim folders, {len(specs)} specs")


def region_used(path: Path) -> int:
    """Bytes in use by every process of the claim, read as the node agent reads it."""
    from kubeletplugin.agent.regions import Region

    region = Region(str(path))
    try:
        return region.used
    finally:
        region.close()
