"""The process map's kernel-fact parsing: pod UIDs in cgroup paths, mount sources."""

from __future__ import annotations

import os
import subprocess

from kubeletplugin.agent import procmap
from kubeletplugin.agent.backstop import _inside, _paths, killable
from kubeletplugin.agent.procmap import ProcessMap, container_id, layout, mount_source, pod_uid
from tests.support import wait_exec

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def test_pod_uid_from_cgroupfs_and_systemd_paths():
    assert pod_uid(f"0::/kubepods/burstable/pod{UID}/3f9a0c\n") == UID
    systemd = UID.replace("-", "_")
    assert pod_uid(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/"
                   "cri-containerd-abc.scope\n") == UID
    # a private cgroup namespace shows the path relative to the reader's root
    assert pod_uid(f"0::/../../kubepods-pod{systemd}.slice/crio-1.scope\n") == UID
    assert pod_uid("0::/user.slice/user-0.slice/session-1.scope\n") is None
    assert pod_uid("0::/kubepods/podnot-a-uid/x\n") is None


VICTIM = "11111111-2222-3333-4444-555555555555"


def test_the_pod_is_the_kubelets_first_pod_component_never_a_deeper_one():
    """Attack 3 of issue 26: a tenant that may make sub-cgroups of its container names one
    pod<victim uid>. Only the kubelet's layout counts: the pod right under kubepods (and its QoS
    class), the container below it; the container's cgroup (cut there) is what gets killed."""
    cid = "ab" * 32
    forged = f"4:memory:/kubepods/burstable/pod{UID}/{cid}/pod{VICTIM}/{'cd' * 32}\n" \
             f"0::/kubepods/burstable/pod{UID}/{cid}/pod{VICTIM}/{'cd' * 32}\n"
    assert layout(forged) == (UID, cid, f"4:memory:/kubepods/burstable/pod{UID}/{cid}\n"
                                        f"0::/kubepods/burstable/pod{UID}/{cid}\n")
    assert container_id(forged) == cid  # not the deeper, tenant-named one
    systemd, victim = UID.replace("-", "_"), VICTIM.replace("-", "_")
    nested = (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/"
              f"cri-containerd-{cid}.scope/kubepods-besteffort-pod{victim}.slice\n")
    assert pod_uid(nested) == UID and container_id(nested) == cid
    kind = (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{systemd}.slice/cri-containerd-{cid}.scope\n")  # --cgroup-root
    assert pod_uid(kind) == UID
    # outside the kubelet's layout a pod name means nothing (a podman container's own sub-cgroup)
    assert pod_uid(f"0::/libpod_parent/libpod-1/kubepods/pod{VICTIM}/x\n") is None
    assert pod_uid(f"0::/kubepods/x/pod{VICTIM}\n") is None  # not a QoS class
    # hierarchies that disagree are no kubelet layout
    assert layout(f"4:memory:/kubepods/pod{UID}/c\n0::/kubepods/pod{VICTIM}/c\n") is None


def test_a_tenant_sub_cgroup_named_after_another_pod_maps_to_its_own_pod(monkeypatch):
    """The process map takes the tenant's own pod (its claim), and the container's cgroup as the
    unit to kill, never the victim's."""
    cid = "ab" * 32
    p = subprocess.Popen(["sleep", "30"])
    cgroup = f"0::/kubepods/pod{UID}/{cid}/pod{VICTIM}\n"
    real_read = procmap._read
    monkeypatch.setattr(procmap, "_read", lambda path: cgroup if path == f"/proc/{p.pid}/cgroup" else real_read(path))
    try:
        m = ProcessMap()
        m.update({}, {}, {"tenant": {UID}, "victim": {VICTIM}})
        assert m.owner(p.pid) == procmap.Owner("tenant", UID, f"0::/kubepods/pod{UID}/{cid}\n")
    finally:
        p.kill()
        p.wait()


def test_mount_source_is_the_bind_mount_root_a_container_shows():
    table = [("254:0", "/", "/"), ("0:52", "/", "/tmp"), ("254:0", "/var/lib/gpushare", "/state"),
             ("0:99", "/x y", "/odd")]
    assert mount_source("/state/claims/u/limits", table) == ("254:0", "/var/lib/gpushare/claims/u/limits")
    assert mount_source("/etc/passwd", table) == ("254:0", "/etc/passwd")
    assert mount_source("/statex/f", table) == ("254:0", "/statex/f")  # not under /state
    assert mount_source("/odd/f", table) == ("0:99", "/x y/f")


def test_mountinfo_escapes_are_decoded(tmp_path, monkeypatch):
    line = "36 35 98:0 /a\\040b/limits /var/run/gpushare/limits ro,relatime - ext4 /dev/x rw\n"
    monkeypatch.setattr(procmap, "_read", lambda path: line)
    assert procmap.mounts(1) == [("98:0", "/a b/limits", "/var/run/gpushare/limits")]


def test_host_process_maps_by_slot_or_run_dir_never_by_a_copy(tmp_path):
    """A host process (the agent's root and cgroup) with no claim facts maps nowhere; a copy
    of a claim's limits file named by GPUSHARE_RUN_DIR does not match (other inode)."""
    real = tmp_path / "claims" / "u1" / "limits"
    real.parent.mkdir(parents=True)
    real.write_text("GPUSHARE_CLAIM_UID=u1\n")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "limits").write_text(real.read_text())
    m = ProcessMap()
    m.update({"u1": str(real)}, {})
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, "GPUSHARE_RUN_DIR": str(fake)})
    q = subprocess.Popen(["sleep", "30"], env={**os.environ, "GPUSHARE_RUN_DIR": str(real.parent)})
    try:
        wait_exec(p, q, program="sleep")
        assert m.owner(p.pid) is None
        owner = m.owner(q.pid)
        assert owner and owner.uid == "u1" and owner.cgroup is None  # never the agent's own cgroup
    finally:
        for proc in (p, q):
            proc.kill()
            proc.wait()


def claim_u1_with_a_process(tmp_path):
    """Claim u1's limits file, a ProcessMap that knows it, and a host process of the claim (by
    GPUSHARE_RUN_DIR) that runs `sleep`: (limits, map, process); the caller kills the process."""
    limits = tmp_path / "claims" / "u1" / "limits"
    limits.parent.mkdir(parents=True)
    limits.write_text("GPUSHARE_CLAIM_UID=u1\n")
    m = ProcessMap()
    m.update({"u1": str(limits)}, {})
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, "GPUSHARE_RUN_DIR": str(limits.parent)})
    wait_exec(p, program="sleep")
    return limits, m, p


def test_a_process_is_known_by_its_pidfd_until_it_exits(tmp_path):
    """owners() reads a process's start time once and then only polls its pidfd: one that exited
    is forgotten (its pidfd closed), so its pid, reused, is looked up afresh."""
    _, m, p = claim_u1_with_a_process(tmp_path)
    try:
        assert m.owners({p.pid})[p.pid].uid == "u1"
        fd, _ = m._known[p.pid]
        assert m.owners({p.pid})[p.pid].uid == "u1"  # the same pidfd
        assert m._known[p.pid][0] == fd
    finally:
        p.kill()
        p.wait()
    assert m.owners({p.pid}) == {}
    assert p.pid not in m._known and fd not in m._pid_of_fd  # closed (no pidfd kept for a process gone)


def test_a_container_is_its_cgroup_and_below_never_the_root_or_the_agents():
    c = "0::/kubepods/pod1/abc\n"
    assert _inside(_paths("0::/kubepods/pod1/abc/nested\n"), _paths(c))  # a delegated sub-cgroup
    assert not _inside(_paths("0::/kubepods/pod1/abcd\n"), _paths(c))
    assert killable(c, "0::/system.slice/gpushare.scope\n")
    assert not killable("2:cpu:/x\n0::/\n", None)             # a hierarchy at its root: the host
    assert not killable(c, "0::/kubepods/pod1/abc/agent\n")    # holds the agent


def test_pod_with_two_claims_is_resolved_by_its_container(monkeypatch):
    """cgroup pod UID -> the claims reserved for the pod; with two, the container ID decides
    (from the pod's status, fed in by the agent); hidden mounts change nothing."""
    cid = "ab" * 32
    p = subprocess.Popen(["sleep", "30"])
    cgroup = f"0::/kubepods/pod{UID}/{cid}\n"
    real_read = procmap._read
    monkeypatch.setattr(procmap, "_read", lambda path: cgroup if path == f"/proc/{p.pid}/cgroup" else real_read(path))
    monkeypatch.setattr(procmap, "mounts", lambda pid: [])  # chroot: no claim mount shows
    try:
        m = ProcessMap()
        m.update({}, {}, {"u1": {UID}})
        assert m.owner(p.pid) == procmap.Owner("u1", UID, cgroup)
        m.update({}, {}, {"u1": {UID}, "u2": {UID}})
        assert m.owner(p.pid) is None and m.unresolved_pods == {UID}
        m.update({}, {}, {"u1": {UID}, "u2": {UID}}, {cid: "u2"})
        assert m.owner(p.pid) == procmap.Owner("u2", UID, cgroup)
        m.update({}, {}, {"u1": {"another-pod"}})
        assert m.owner(p.pid) is None and m.unknown_pods == {UID}
    finally:
        p.kill()
        p.wait()


def test_a_process_that_has_begun_to_exit_is_not_mapped_to_be_killed_alone(monkeypatch, tmp_path):
    """Once a process begins to exit (PF_EXITING) the kernel shows its cgroup v1 paths at the root,
    while its mount table still shows the claim's mount. Mapped then (a poll that read NVML just
    before the process freed and left), its unit was not killable: the process alone was killed
    and its container's shell loop lived on to allocate again. It is not mapped then; before, the
    mapping keeps the container's cgroup."""
    limits = tmp_path / "limits"
    limits.write_text("")
    dev, root = mount_source(str(limits))
    container = "4:memory:/libpod_parent/libpod-1\n0::/libpod_parent/libpod-1\n"
    leaving = "4:memory:/\n0::/libpod_parent/libpod-1\n"  # what the kernel shows once it exits
    p = subprocess.Popen(["sleep", "30"])
    now = {"cgroup": container, "exiting": False}
    real_read = procmap._read
    monkeypatch.setattr(procmap, "_read", lambda path: now["cgroup"] if path == f"/proc/{p.pid}/cgroup"
                        else real_read(path))
    real_exiting = procmap._exiting_at
    monkeypatch.setattr(procmap, "_exiting_at", lambda at: now["exiting"] if at == f"/proc/{p.pid}"
                        else real_exiting(at))
    try:
        m = ProcessMap()
        m.update({"u1": str(limits)}, {})
        monkeypatch.setattr(procmap, "mounts", lambda pid: [(dev, root, "/run/gpushare/limits")])
        owner = m.owner(p.pid)
        assert owner == procmap.Owner("u1", None, container) and killable(container, None)
        now.update(cgroup=leaving, exiting=True)
        m.forget_except(set())  # looked up again
        owner = m.owner(p.pid)
        assert owner is None or (owner.cgroup is not None and killable(owner.cgroup, None)), owner
        v2 = "0::/libpod_parent/libpod-1\n"  # cgroup v2 keeps an exiting task's path: still mapped
        now.update(cgroup=v2)  # (a main thread that exited while the others run on, say)
        m.forget_except(set())
        assert m.owner(p.pid) == procmap.Owner("u1", None, v2)
    finally:
        p.kill()
        p.wait()


def test_exiting_reads_the_flag_of_a_live_process_and_of_a_zombie():
    p = subprocess.Popen(["sleep", "30"])
    wait_exec(p, program="sleep")
    assert not procmap.exiting(p.pid)
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped: PF_EXITING
    assert procmap.exiting(p.pid)
    p.wait()
    assert procmap.exiting(p.pid)  # gone


def test_a_mapped_process_follows_its_claim_going(tmp_path):
    """owners()'s one lookup per known pid (the mapped ones) is dropped with the claims it came
    from: the claim gone, its process maps nowhere; back, it maps again."""
    limits, m, p = claim_u1_with_a_process(tmp_path)
    try:
        g = m.settle()
        assert m.owners({p.pid})[p.pid].uid == "u1" and m._mapped[p.pid].uid == "u1"
        assert m.settle() > g  # a new mapping moves the generation (the backstop looks again)
        g = m.settle()
        assert m.owners({p.pid})[p.pid].uid == "u1" and m.settle() == g  # nothing changed: it stays
        m.update({}, {})
        assert m.settle() > g
        assert m.owners({p.pid}) == {} and p.pid not in m._mapped
        m.update({"u1": str(limits)}, {})
        assert m.owners({p.pid})[p.pid].uid == "u1"
        g = m.settle()
    finally:
        p.kill()
        p.wait()
    assert m.settle() > g  # exited: forgotten by the settle itself
    assert m.owners({p.pid}) == {} and p.pid not in m._mapped


def fake_task(folder, cgroup: str, exiting: bool) -> str:
    """A /proc folder of one task: its cgroup text and a stat line whose flags say PF_EXITING."""
    os.makedirs(folder, exist_ok=True)
    (folder / "cgroup").write_text(cgroup)
    flags = procmap.PF_EXITING if exiting else 0
    (folder / "stat").write_text(f"7 (relay (x)) S 1 7 7 0 -1 {flags} 0 0 0 0\n")
    return str(folder)


def test_a_thread_that_exits_while_read_is_not_believed_the_next_one_is(tmp_path, monkeypatch):
    """Issue 40, cgroup v2 (systemd layout) and v1 side by side: the main thread is a zombie, each
    thread starts the next and exits. A read of a thread that began to exit during it (its stat
    says so after the read) is thrown away, v1 `/` and all; the thread list is read again and a
    thread that was live through its read answers."""
    cid = "ab" * 32
    path = f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    live_text = f"8:pids:{path}\n0::{path}\n"
    leader = fake_task(tmp_path / "7", "8:pids:/\n0::" + path + "\n", exiting=True)
    rounds = [[leader, fake_task(tmp_path / "7" / "task" / "8", live_text, exiting=False)],
              [leader, fake_task(tmp_path / "7" / "task" / "9", live_text, exiting=False)]]
    monkeypatch.setattr(procmap, "_threads", lambda pid: iter(rounds.pop(0) if rounds else [leader]))

    def read(at):
        text = procmap._read(f"{at}/cgroup")
        if at.endswith("/8"):  # thread 8 exits while it is read: v1 shows the root from then on
            fake_task(tmp_path / "7" / "task" / "8", "8:pids:/\n0::" + path + "\n", exiting=True)
        return text

    at, text = procmap.live(7, read)
    assert at == str(tmp_path / "7" / "task" / "9") and text == live_text
    assert pod_uid(text) == UID and container_id(text) == cid
    # every thread exiting: no live folder, and what the main thread's shows (the lookup maps no v1 root)
    assert procmap.live(7, read) == (None, "8:pids:/\n0::" + path + "\n")


def test_a_process_that_could_not_be_mapped_is_looked_up_again_at_the_next_call(tmp_path, monkeypatch):
    """Issue 40: a lookup whose every thread read was raced (the threads came and went) mapped
    nothing, and a miss was not looked up again for 1 s. It is at the next call (the backstop's
    next poll)."""
    limits, m, p = claim_u1_with_a_process(tmp_path)
    try:
        real_live = procmap.live
        raced = iter([True])
        monkeypatch.setattr(procmap, "live", lambda pid, read: (None, ("4:memory:/\n", []))
                            if next(raced, False) else real_live(pid, read))
        assert m.owners({p.pid}) == {}  # no thread was live through its read
        assert m.owners({p.pid})[p.pid].uid == "u1"
    finally:
        p.kill()
        p.wait()


def test_a_process_of_no_claim_is_looked_up_again_when_its_cgroup_changes(monkeypatch):
    """A process that maps nowhere, its facts read from a live thread, costs one read of its
    cgroup at each call, not a lookup; its cgroup reading otherwise, it is looked up again."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        wait_exec(p, program="sleep")
        m = ProcessMap()
        m.update({}, {}, {"u1": {UID}})
        lookups = []
        real_lookup = m._lookup
        monkeypatch.setattr(m, "_lookup", lambda pid, key: (lookups.append(pid), real_lookup(pid, key))[1])
        assert m.owner(p.pid) is None and m.owner(p.pid) is None and len(lookups) == 1
        pod = f"0::/kubepods/pod{UID}/c\n"
        real_read = procmap._read
        monkeypatch.setattr(procmap, "_read", lambda path: pod if path == f"/proc/{p.pid}/cgroup" else real_read(path))
        assert m.owner(p.pid) == procmap.Owner("u1", UID, pod) and len(lookups) == 2
    finally:
        p.kill()
        p.wait()
