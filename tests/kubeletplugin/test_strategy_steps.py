"""The one interface the driver calls every sharing strategy through (kubeletplugin/strategies/):
the steps in order over the real gRPC sockets, a strategy's failure rolling Prepare back, and
the fault points the driver's steps are marked with."""

from __future__ import annotations

import os

import pytest

from kubeletplugin.faults import reaches
from kubeletplugin.strategies import Strategy, StrategyError
from playground.claims import make_claim, result
from tests.support.cdi import spec_path


class Recording(Strategy):
    """Records each step as (step, uid, uids of the prepared claims it was given); fails acquire
    when told to."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        self.fail = fail

    def acquire(self, claim):
        self.calls.append(("acquire", claim.uid, ()))
        if self.fail:
            raise StrategyError("a test strategy", "test", self.fail)
        return claim

    def apply(self, claim, claims):
        self.calls.append(("apply", claim.uid, tuple(sorted(claims))))

    def release(self, uid):
        self.calls.append(("release", uid, ()))


def test_the_driver_calls_each_strategy_at_each_step(api, plugin, kubelet):
    recording = Recording()
    plugin.driver.strategies = (*plugin.driver.strategies, recording)
    claim = make_claim(api, [result("gpu-0")])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    assert kubelet.prepare(claim).claims[claim.uid].error == ""  # prepared already: no step again
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert recording.calls == [("acquire", claim.uid, ()), ("apply", claim.uid, (claim.uid,)),
                               ("release", claim.uid, ()), ("apply", claim.uid, ())]


def test_a_strategys_failure_fails_the_claim_and_rolls_it_back(api, plugin, kubelet, dirs):
    recording = Recording(fail=RuntimeError("no room"))
    plugin.driver.strategies = (*plugin.driver.strategies, recording)
    errors: list[tuple[str, str]] = []
    plugin.driver.on_error = lambda operation, reason: errors.append((operation, reason))
    claim = make_claim(api, [result("gpu-0")])
    assert kubelet.prepare(claim).claims[claim.uid].error.endswith("a test strategy: no room")
    assert errors == [("prepare", "test")]
    assert recording.calls == [("acquire", claim.uid, ()), ("release", claim.uid, ())]
    assert plugin.driver.checkpoint.get(claim.uid) is None
    assert not os.path.exists(os.path.join(dirs.state, "claims", claim.uid))
    assert not os.path.exists(spec_path(dirs, claim.uid))


def test_a_step_reaches_its_fault_point_when_it_returns():
    class Steps:
        def __init__(self):
            self.faults = self
            self.log: list[str] = []

        def reached(self, step):
            self.log.append(f"reached {step}")

        @reaches("prepare-files-written")
        def write(self, what):
            self.log.append(f"wrote {what}")
            return what

    steps = Steps()
    assert steps.write("files") == "files"
    assert steps.log == ["wrote files", "reached prepare-files-written"]
    with pytest.raises(ValueError, match="fault point 'prepare-files-writen': not one of prepare-started-recorded"):
        reaches("prepare-files-writen")
