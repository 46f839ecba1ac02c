"""dra_driver.hookpath finds the native files of a source checkout (and says where it looked)."""
import os

import pytest

from dra_driver import hookpath


def test_native_paths_source_checkout(build):
    p = hookpath.native_paths()
    for key in ("library", "sim_cuda", "sim_nvml", "probe", "sim_dir"):
        assert os.path.isabs(p[key]) and os.path.exists(p[key]), key
    assert p["library"].endswith("libgpushare.so") and p["sim_cuda"].startswith(p["sim_dir"])


def test_native_paths_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(hookpath, "_candidates", lambda: [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "a")):
        hookpath.native_paths()
