"""One claim cannot hold up the others: a slow claim (a hung API read) or a hostile config
leaves other claims' calls and the health check answering promptly."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from grpc_health.v1 import health_pb2, health_pb2_grpc

from kubeletplugin.faults import Faults
from kubeletplugin.main import GRPC_WORKERS
from playground.claims import gpushare_config, make_claim, opaque_config, result

SLOW_S = 8.0
PROMPT_S = 3.0  # a Prepare takes ~10 ms; 3 s is the margin for a loaded 2-core machine


def timed(call):
    start = time.monotonic()
    value = call()
    return value, time.monotonic() - start


def test_slow_claim_does_not_stall_other_claims_or_health(api, plugin, kubelet):
    slow = make_claim(api, [result("gpu-0-share-0")], name="slow-claim")
    others = [make_claim(api, [result(f"gpu-{n % 4}-share-1")]) for n in range(6)]
    plugin.driver.faults = Faults(delay=("slow-claim", SLOW_S))
    slow_answer = {}
    slow_call = threading.Thread(target=lambda: slow_answer.update(a=timed(lambda: kubelet.prepare(slow))))
    slow_call.start()
    time.sleep(0.5)  # the slow claim is now inside its Prepare
    health = health_pb2_grpc.HealthStub(kubelet.dra)
    reply, took = timed(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=PROMPT_S))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING and took < PROMPT_S
    # Other claims, each in its own call as the kubelet sends one call per pod.
    with ThreadPoolExecutor(len(others)) as pool:
        answers = list(pool.map(lambda c: timed(lambda: kubelet.prepare(c).claims[c.uid]), others))
    assert all(a.error == "" for a, _ in answers), answers
    assert max(took for _, took in answers) < PROMPT_S, [took for _, took in answers]
    # A second pod of the slow claim waits for the first (one claim, one lock), then gets its answer.
    assert slow_call.is_alive()
    slow_call.join(timeout=SLOW_S + 30)
    answer, took = slow_answer["a"]
    assert answer.claims[slow.uid].error == "" and took >= SLOW_S


def test_hostile_config_is_refused_at_once_and_others_carry_on(api, kubelet, dirs):
    """The issue's attack: memoryLimit "1e10000000" froze the plugin for over 15 minutes."""
    hostile = make_claim(api, [result("gpu-1-share-0")],
                         config=[opaque_config(gpushare_config(memoryLimit="1e10000000"))])
    good = make_claim(api, [result("gpu-1-share-1")])
    response, took = timed(lambda: kubelet.prepare(hostile, good))
    error = response.claims[hostile.uid].error
    assert "memoryLimit" in error and "'1e10000000'" in error and "exponent out of range" in error
    assert response.claims[good.uid].error == ""
    assert took < PROMPT_S



def test_calls_queued_behind_a_slow_claim_give_their_workers_back(api, plugin, kubelet):
    """More calls for one slow claim than there are gRPC workers (pods sharing the claim):
    each waits a bounded time for the claim's lock, then answers "busy" (the kubelet retries),
    so other claims and the health check still get a worker."""
    plugin.driver._locks.wait_s = 1.0  # 5 s in production; shorter keeps the test short
    slow = make_claim(api, [result("gpu-3-share-0")], name="slow-shared")
    other = make_claim(api, [result("gpu-3-share-1")])
    plugin.driver.faults = Faults(delay=("slow-shared", SLOW_S))
    with ThreadPoolExecutor(GRPC_WORKERS + 8) as pool:
        first = pool.submit(kubelet.prepare, slow)
        time.sleep(0.5)
        waiters = [pool.submit(lambda: kubelet.prepare(slow).claims[slow.uid]) for _ in range(GRPC_WORKERS + 4)]
        time.sleep(0.5)  # every worker is now taken: one by the slow call, the rest waiting for its lock
        answer, took = timed(lambda: kubelet.prepare(other).claims[other.uid])
        assert answer.error == "" and took < PROMPT_S + 1, took
        health = health_pb2_grpc.HealthStub(kubelet.dra)
        reply, took = timed(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=PROMPT_S + 1))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING and took < PROMPT_S + 1
        errors = [f.result().error for f in waiters]
        assert all("another call for this claim is still running after 1 s" in e for e in errors), errors
        assert first.result().claims[slow.uid].error == ""
    assert kubelet.prepare(slow).claims[slow.uid].error == ""  # the kubelet's retry: the recorded answer
