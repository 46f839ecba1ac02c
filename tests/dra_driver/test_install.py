"""install-hook: versioned files are never overwritten; the stable name moves atomically."""

import os

from dra_driver.install import install_versioned


def test_new_build_gets_new_file_and_old_one_is_kept(tmp_path):
    src, dest = tmp_path / "libgpushare.so", tmp_path / "host"
    src.write_bytes(b"build one")
    first = install_versioned(src, dest, "libgpushare.so")
    assert os.readlink(dest / "libgpushare.so") == first.name
    assert first.name.startswith("libgpushare-") and first.name.endswith(".so")

    before = os.stat(first)
    assert install_versioned(src, dest, "libgpushare.so") == first  # same build: untouched
    assert os.stat(first).st_ino == before.st_ino and os.stat(first).st_mtime_ns == before.st_mtime_ns

    src.write_bytes(b"build two")
    second = install_versioned(src, dest, "libgpushare.so")
    assert second != first
    assert first.read_bytes() == b"build one"  # a running container's mapping stays valid
    assert (dest / "libgpushare.so").read_bytes() == b"build two"
    assert sorted(p.name for p in dest.iterdir()) == sorted(["libgpushare.so", first.name, second.name])


def test_sim_library_names_keep_their_soname_suffix(tmp_path):
    src = tmp_path / "libcuda.so.1"
    src.write_bytes(b"sim")
    installed = install_versioned(src, tmp_path / "sim", "libcuda.so.1")
    assert installed.name.startswith("libcuda-") and installed.name.endswith(".so.1")
    assert (tmp_path / "sim" / "libcuda.so.1").read_bytes() == b"sim"


def test_prune_keeps_builds_in_use_and_the_linked_one(tmp_path):
    from dra_driver.install import prune_versions

    src, dest = tmp_path / "libgpushare.so", tmp_path / "host"
    built = []
    for n in range(4):
        src.write_bytes(b"build %d" % n)
        built.append(install_versioned(src, dest, "libgpushare.so"))
    (dest / "libgpushare-notahash.so").write_bytes(b"not ours")
    (dest / "sim").mkdir()
    removed = prune_versions(dest, "libgpushare.so", {str(built[1])})
    assert sorted(removed) == sorted([built[0], built[2]])
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["libgpushare.so", built[1].name, built[3].name, "libgpushare-notahash.so", "sim"])
    assert prune_versions(dest, "libgpushare.so", set()) == [built[1]]  # the linked build always stays
