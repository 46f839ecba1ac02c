"""A claim that does not get its compute share says why in its status (the node agent's
_report_shares; the conditions: kubeletplugin/agent/status.py), against the API emulator."""
from kubernetes import client

from kubeletplugin.agent.agent import Agent
from kubeletplugin.agent.claimview import ClaimView
from kubeletplugin.agent.shares import KERNEL_REPORTS, MAX_PERIOD_US, Share, kernel_loss, plan_gpu
from kubeletplugin.prepared import PreparedClaim, PreparedDevice, PreparedGpu
from tests.support import wait_for
from tests.support.claimstatus import DRIVER, POOL, allocated_claim, entries


def conditions(r: client.ResourceV1Api) -> list[dict]:
    return entries(r, "default", "long-kernels").get(DRIVER, {}).get("conditions") or []


def report(share: Share, kernel_us: int, neighbour: Share) -> None:
    """KERNEL_REPORTS agent periods of 1 s in which both claims are busy"""
    for _ in range(KERNEL_REPORTS):
        share.count(500_000_000, 1.0, kernel_us)
        neighbour.count(500_000_000, 1.0, 2650)
    plan_gpu([share, neighbour])


def test_a_claim_whose_kernels_are_too_long_for_its_share_says_so_in_its_status(emulator):
    api = emulator.api_client()
    r = client.ResourceV1Api(api)
    uid = allocated_claim(r, "default", "long-kernels")
    gpu = PreparedGpu(0, "GPU-0", 0, 1 << 30, 10)
    prepared = PreparedClaim("default", "long-kernels", uid, (gpu,), (PreparedDevice(("gpu",), POOL, "gpu-0"),))

    class Source:
        def prepared_claims(self) -> dict[str, PreparedClaim]:
            return {uid: prepared}

    agent = Agent(Source(), None, api, DRIVER, "node-a", "mock")  # type: ignore[arg-type]
    share, neighbour = Share(limit=0.1, burst=False, trusted=True), Share(limit=0.9, burst=False, trusted=True)
    view = ClaimView(uid, "default", "long-kernels", (gpu,), "", [None], [None], [share])
    agent.status.start()
    try:
        # 16.62 ms kernels: no period up to 1 s holds whole ones in a 10 % slot without losing 1 %
        report(share, 16_620, neighbour)
        assert share.period_us == MAX_PERIOD_US and round(kernel_loss(share), 4) == 0.0166
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        (cond,) = wait_for(lambda: conditions(r), what="the condition")
        assert (cond["type"], cond["status"], cond["reason"]) == ("ComputeShareHeld", "False", "KernelsTooLong")
        assert "16.6 ms" in cond["message"] and "1.7 % of the GPU less than its share of 10 %" in cond["message"]

        agent._report_shares({uid: view}, time_sliced=set())  # an MPS GPU: no handover, no such loss
        wait_for(lambda: DRIVER in entries(r, "default", "long-kernels") and not conditions(r),
                 what="none under MPS")
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        wait_for(lambda: conditions(r), what="the condition again")

        share.count(0, 1.0, 0)  # an idle period (its busy window is 1 s): the condition stays
        neighbour.count(0, 1.0, 0)
        plan_gpu([share, neighbour])
        assert not share.busy
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        assert agent._short[uid].keys() == {0}

        report(share, 5000, neighbour)  # its kernels get shorter: a 600 ms period holds them
        assert kernel_loss(share) <= 0.01
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        wait_for(lambda: not conditions(r), what="the condition gone")

        agent._oversubscribed["GPU-0"] = 1.5  # its GPU's paced claims' limits sum to 150 % (plan_gpu's answer)
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        (cond,) = wait_for(lambda: conditions(r), what="the GPU oversubscribed")
        assert (cond["reason"], cond["status"]) == ("GpuOversubscribed", "False")
        assert "sum to 150 %" in cond["message"] and "this claim 6.7 % for its 10 %" in cond["message"], cond
        agent._oversubscribed["GPU-0"] = 0.0
        share.count(0, 1.0, 0)  # idle: an oversubscribed GPU's condition goes all the same
        agent._report_shares({uid: view}, time_sliced={"GPU-0"})
        wait_for(lambda: not conditions(r), what="the oversubscription's condition gone")
    finally:
        agent.status.stop()
