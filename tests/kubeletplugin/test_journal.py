"""The checkpoint's journal (kubeletplugin/checkpoint.py): appended lines, torn tails, compaction."""

import os

import pytest

from kubeletplugin import checkpoint as ckpt


def entry(name: str) -> ckpt.Entry:
    return ckpt.Entry(ckpt.PREPARE_STARTED, "default", name, None)


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def cp(tmp_path):
    c = ckpt.Checkpoint(str(tmp_path / "checkpoint.json"), "boot")
    c.replace_all({})
    return c


def reread(c: ckpt.Checkpoint) -> dict[str, ckpt.Entry]:
    fresh = ckpt.Checkpoint(c.path, "boot")
    fresh.load()
    return dict(fresh.items())


def test_a_change_appends_a_line_and_leaves_the_file(cp):
    before = os.stat(cp.path).st_ino
    cp.set(uid(1), entry("a"))
    cp.delete(uid(1))
    cp.set(uid(2), entry("b"))
    assert os.stat(cp.path).st_ino == before  # the file was not rewritten
    with open(cp.journal_path, "rb") as f:
        assert len(f.read().splitlines()) == 3
    assert reread(cp) == {uid(2): entry("b")}


def test_a_torn_last_line_is_ignored_and_the_next_write_is_whole(cp):
    cp.set(uid(1), entry("a"))
    with open(cp.journal_path, "ab") as f:
        f.write(ckpt.journal_line(uid(2), entry("b"))[:-9])  # a crash half-way through an append
    fresh = ckpt.Checkpoint(cp.path, "boot")
    fresh.load()
    assert dict(fresh.items()) == {uid(1): entry("a")}
    fresh.set(uid(3), entry("c"))
    assert os.path.getsize(fresh.journal_path) == 0  # compacted: nothing appended after the torn line
    assert reread(fresh) == {uid(1): entry("a"), uid(3): entry("c")}


def test_a_bad_line_before_the_last_is_corrupt(cp):
    cp.set(uid(1), entry("a"))
    cp.set(uid(2), entry("b"))
    with open(cp.journal_path, "r+b") as f:
        f.seek(5)
        f.write(b"XX")
    with pytest.raises(ckpt.CheckpointCorrupt, match="journal line 1"):
        reread(cp)


def test_replaying_the_journal_over_the_compacted_file_changes_nothing(cp):
    # A crash between rewriting the file and emptying the journal: both are read, same state.
    cp.set(uid(1), entry("a"))
    cp.set(uid(2), entry("b"))
    cp.delete(uid(1))
    with open(cp.journal_path, "rb") as f:
        journal = f.read()
    cp.compact()
    with open(cp.journal_path, "wb") as f:
        f.write(journal)
    assert reread(cp) == {uid(2): entry("b")}


def test_the_journal_is_compacted_when_it_outgrows_the_claims(cp):
    for n in range(ckpt.COMPACT_MIN):  # one claim, changed again and again
        cp.set(uid(1), entry(str(n)))
    assert os.path.getsize(cp.journal_path) > 0
    cp.set(uid(1), entry("last"))  # one line more than the bound
    assert os.path.getsize(cp.journal_path) == 0
    assert reread(cp) == {uid(1): entry("last")}


def test_a_reader_follows_appends_and_compactions(cp):
    reader = ckpt.Checkpoint(cp.path, "boot")  # the node agent's view, another object on the same files
    cp.set(uid(1), entry("a"))
    assert reader.on_disk() == {uid(1): entry("a")}
    cp.set(uid(2), entry("b"))
    with open(cp.journal_path, "ab") as f:
        f.write(ckpt.journal_line(uid(3), entry("c"))[:20])  # a line being appended: not read yet
    assert reader.on_disk() == {uid(1): entry("a"), uid(2): entry("b")}
    cp.compact()  # rewrites the file and starts a new journal
    cp.delete(uid(2))
    cp.set(uid(4), entry("d"))
    assert reader.on_disk() == {uid(1): entry("a"), uid(4): entry("d")}
