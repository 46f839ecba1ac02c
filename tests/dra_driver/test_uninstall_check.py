"""gpushare-dra uninstall-check's choice of the claims that hold an uninstall back (the Helm
chart's pre-delete hook; tests/cluster/test_helm_install.py runs it on the real cluster)."""

from __future__ import annotations

from dra_driver.uninstall import ClaimInUse, claims_in_use

DRIVER = "gpushare.dev"


def claim(name: str, driver: str = DRIVER, pods: tuple[str, ...] = (), prepared: bool = False,
          allocated: bool = True) -> dict:
    status: dict = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": "node-a", "device": "gpu-0"}]}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    if prepared:
        status["devices"] = [{"driver": driver, "pool": "node-a", "device": "gpu-0"}]
    return {"metadata": {"namespace": "team", "name": name}, "status": status}


def test_claims_that_pods_use_or_a_plugin_prepared_hold_the_uninstall_back():
    claims = [claim("used", pods=("b", "a")), claim("left-prepared", prepared=True), claim("idle"),
              claim("pending", allocated=False), claim("other-driver", driver="gpu.nvidia.com", pods=("x",))]
    assert claims_in_use(claims, DRIVER) == [
        ClaimInUse("team", "left-prepared", ("node-a",), ()), ClaimInUse("team", "used", ("node-a",), ("a", "b"))]
    assert claims_in_use(claims, DRIVER)[1].describe() == "team/used (node node-a; pods a, b)"
    assert claims_in_use(claims, DRIVER)[0].describe() == \
        "team/left-prepared (node node-a; pods no pod any more, still prepared)"
    assert claims_in_use([claim("idle")], DRIVER) == []
