"""The claim's compute share in the images users run (test_image_matrix.py's glibc roots under
podman): the probe's launches, preloaded with the library on the root's own glibc, are paced to
the claim's 50 %. Apart from the image matrix because it reads a share over a fixed window: it
runs alone on the machine in `make test`'s serial part, the rest of the matrix beside other tests."""

from __future__ import annotations

import pytest

from playground.containers import PodmanRunner
from tests.support import CPU_TIMED, roots
from tests.support.hook import kv

pytestmark = pytest.mark.podman

WHY_NOT = roots.podman_why_not()
if WHY_NOT:
    pytest.skip(f"image pacing: {WHY_NOT}", allow_module_level=True)


@CPU_TIMED
@pytest.mark.parametrize("suite", sorted(roots.GLIBC_SUITES))
def test_glibc_image_paces_the_claim(image_claim, suite):
    _, ids = image_claim
    runner = PodmanRunner(rootfs=str(roots.glibc_root(suite)))
    try:
        # unpaced, the probe keeps the simulated GPU busy all the time
        out = kv(roots.run_ok(runner, ids, [roots.PROBE, "launch", "--seconds", "4"]).stdout)
        assert 35 <= float(out["busy_share"]) <= 65, out
    finally:
        runner.close()
