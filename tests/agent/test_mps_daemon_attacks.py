"""A tenant of an MPS claim against the GPU's MPS control daemon (issue 27; docs/security.md,
"MPS: the control daemon"). The tenant is root in a mount namespace of its own with the claim's
MPS mounts at their container paths and options (tests/support/tenant.py), as runc gives them;
the node runs the plugin with the stand-in daemon (playground/mpscontrol.py). Each attack was
found against the build before issue 27 (the pipe folder mounted read-write, the daemon's
commands taken from any connection to it, one connection at a time) and is a test here:

1. raise the server's default active thread percentage from 30 to 100;
2. send `quit`: the daemon was gone and nothing reported it;
3. hold a connection open: the next Prepare took 10.3 s and started a second daemon;
4. bind an impostor socket in the pipe folder: the plugin sent it the limits;
5. plant the daemon's temporary file as a symlink to a host file: the next Prepare made the
   daemon (host root) overwrite that file and make it 0644.

Besides: an end of the daemon the plugin did not ask for is an Event on each MPS claim of the GPU
and a metric within the agent's period; the plugin talks only to a daemon whose peer
credentials are the daemon's (an impostor where no container can write is refused too)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import textwrap
import time

import pytest
from kubernetes import client

from kubeletplugin.agent.mpswatch import DAEMON_REASON
from kubeletplugin.strategies.mps import layout as mpslayout
from kubeletplugin.strategies.mps.control import MpsError
from playground.claims import gpushare_config, opaque_config
from tests.support import wait_for
from tests.support.tenant import run_tenant, start_tenant

MPS = [opaque_config(gpushare_config(sharingStrategy="MPS"))]
PIPE = "/tmp/nvidia-mps"  # where the claim's containers see the pipe folder


@pytest.fixture
def mps(node_factory, tmp_path):
    node = node_factory()
    refs = []

    def claim(compute: int = 30):
        ref, ids = node.claim(memory="1Gi", compute=compute, config=MPS)
        refs.append(ref)
        return ref, ids

    def tenant(ids, code: str, **kw) -> str:
        return run_tenant(node.dirs.cdi, ids, str(tmp_path / f"view{len(os.listdir(tmp_path))}"),
                          textwrap.dedent(code), **kw)

    node.mps_claim, node.tenant = claim, tenant
    yield node
    for ref in refs:
        node.kubelet.unprepare(ref)
    for pid in daemons(node.dirs.state):  # a daemon an attack started or left behind
        os.kill(pid, signal.SIGKILL)


def uuid_of(node, ref) -> str:
    return node.plugin.driver.prepared_claims()[ref.uid].gpus[0].uuid


def default_threads(node, uuid: str) -> str:
    return node.plugin.driver.mps.command(uuid, "get_default_active_thread_percentage")[0]


def daemons(state_dir: str) -> list[int]:
    """The stand-in daemons serving a pipe folder under this state dir."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"playground.mpscontrol" in cmd and b"-d" in cmd and \
                env.get(b"CUDA_MPS_PIPE_DIRECTORY", b"").startswith(state_dir.encode()):
            found.append(int(pid))
    return found


SEND = """
    import os, socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(os.environ["VIEW"] + "{pipe}/control")
        s.sendall({line!r})
        s.shutdown(socket.SHUT_WR)
        print("reply:", s.recv(4096))
    except OSError as e:
        print("refused:", e)
"""


def test_a_tenant_cannot_raise_the_servers_default_percentage(mps):
    ref, ids = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    assert float(default_threads(mps, uuid)) == 30
    out = mps.tenant(ids, SEND.format(pipe=PIPE, line=b"set_default_active_thread_percentage 100\n"))
    print("tenant:", out.strip())
    assert float(default_threads(mps, uuid)) == 30
    with open(os.path.join(mpslayout.pipe_dir(mps.dirs.state, uuid), "gpushare-sim-mps")) as f:
        assert "ACTIVE_THREAD_PERCENTAGE=30\n" in f.read()  # what the simulated clients get


def test_a_tenant_cannot_quit_the_daemon(mps):
    ref, ids = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    (daemon,) = daemons(mps.dirs.state)
    out = mps.tenant(ids, SEND.format(pipe=PIPE, line=b"quit\n"))
    print("tenant:", out.strip())
    time.sleep(0.3)
    assert daemons(mps.dirs.state) == [daemon]
    assert mps.plugin.driver.mps.command(uuid, mpslayout.GET_SERVERS) is not None


def daemon_events(node, ref) -> list:
    items = client.CoreV1Api(node.api).list_namespaced_event(ref.namespace).items
    return [e for e in items if e.involved_object.uid == ref.uid and e.reason == DAEMON_REASON]


def exits_metric(node, uuid: str) -> float | None:
    samples = node.scrape().get("gpushare_mps_daemon_exits_total", {})
    return next((v for labels, v in samples.items() if dict(labels)["UUID"] == uuid), None)


def test_a_daemon_end_the_plugin_did_not_ask_for_is_an_event_and_a_metric(mps):
    """However it ended (a quit the plugin did not send, a kill, a crash), the agent sees the
    daemon gone while MPS claims of its GPU are prepared, within its period (0.5 s here)."""
    ref, _ = mps.mps_claim(30)
    other, _ = mps.mps_claim(20)
    uuid = uuid_of(mps, ref)
    # the series appears, at 0, once an agent period has seen the GPU's new daemon
    wait_for(lambda: exits_metric(mps, uuid) == 0, timeout=2, what="the exits series at 0")
    (daemon,) = daemons(mps.dirs.state)
    os.kill(daemon, signal.SIGKILL)
    t0 = time.monotonic()
    for r in (ref, other):
        (event,) = wait_for(lambda r=r: daemon_events(mps, r), timeout=5, what="the daemon's exit Event")
        assert event.type == "Warning" and uuid in event.message and str(daemon) in event.message
    took = time.monotonic() - t0
    assert exits_metric(mps, uuid) == 1
    print(f"daemon killed: Events on both MPS claims after {took:.2f} s (agent period 0.5 s)")
    assert took <= 2.0


def test_the_plugins_own_quit_is_not_reported(mps):
    ref, _ = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    mps.kubelet.unprepare(ref)  # the GPU's last MPS claim: the plugin quits its daemon
    time.sleep(1.5)  # three agent periods
    assert daemon_events(mps, ref) == [] and daemons(mps.dirs.state) == []
    assert exits_metric(mps, uuid) in (None, 0)


def test_a_held_connection_does_not_stall_the_next_prepare(mps):
    _, ids = mps.mps_claim(30)
    holder = start_tenant(mps.dirs.cdi, ids, os.path.join(mps.dirs.root, "view-hold"), textwrap.dedent(f"""
        import os, socket, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(os.environ["VIEW"] + "{PIPE}/control")
            print("holding", flush=True)
        except OSError as e:
            print("refused:", e, flush=True)
        time.sleep(60)
    """))
    try:
        assert holder.stdout is not None
        print("tenant:", holder.stdout.readline().strip())
        t0 = time.monotonic()
        mps.mps_claim(20)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    print(f"the next Prepare took {took:.2f} s while a tenant held a connection")
    assert took < 2.0
    assert len(daemons(mps.dirs.state)) == 1


def test_refused_words_of_a_mebibyte_log_bounded_lines(mps):
    """128 command words of 1 MiB on the clients' socket, one connection each: the daemon logged
    each refusal with the whole word (128 MiB of control.log in 2 s, issue 40). Now a refused
    line is logged cut to a bounded length, and a line longer than the daemon reads ends the
    connection; the daemon still takes the plugin's commands."""
    ref, ids = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    log_path = mpslayout.control_log(mps.dirs.state, uuid)
    before = os.path.getsize(log_path)
    out = mps.tenant(ids, f"""
        import os, socket
        sent = 0
        for i in range(128):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(os.environ["VIEW"] + "{PIPE}/control")
                s.sendall(bytes([97 + i % 26]) * (1 << 20) + b"\\n")
                sent += 1
            except OSError:  # the daemon closed the connection part-way
                sent += 1
            finally:
                s.close()
        print("sent", sent, "words of 1 MiB")
    """, timeout=120)
    print("tenant:", out.strip())
    assert "sent 128" in out
    mps.plugin.driver.mps.command(uuid, mpslayout.GET_SERVERS)  # still serving, and it logged everything first
    with open(log_path, "rb") as f:
        f.seek(before)
        added = f.read()
    lines = added.splitlines()
    print(f"control.log grew {len(added)} bytes in {len(lines)} lines, the longest {max(map(len, lines))} bytes")
    assert len(added) < 64 << 10, len(added)
    assert max(map(len, lines)) < 512
    assert sum(b"Refused" in line for line in lines) >= 1


def test_an_impostor_socket_never_receives_the_limits(mps):
    ref, ids = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    impostor = start_tenant(mps.dirs.cdi, ids, os.path.join(mps.dirs.root, "view-impostor"), textwrap.dedent(f"""
        import os, socket
        path = os.environ["VIEW"] + "{PIPE}/control"
        try:
            os.unlink(path)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            s.listen(8)
            print("listening", flush=True)
        except OSError as e:
            print("refused:", e, flush=True)
            raise SystemExit
        s.settimeout(10)
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                break
            c.settimeout(2)
            print("received:", c.recv(4096), flush=True)
            c.close()
    """))
    try:
        assert impostor.stdout is not None
        print("tenant:", impostor.stdout.readline().strip())
        mps.mps_claim(40)
    finally:
        impostor.kill()
        out, _ = impostor.communicate()
    print("tenant afterwards:", out.strip())
    assert "received" not in out
    assert float(default_threads(mps, uuid)) == 40  # the daemon got the new ceiling


def test_a_symlink_planted_in_the_pipe_folder_writes_no_host_file(mps, tmp_path):
    host_file = tmp_path / "host-file"
    host_file.write_text("precious\n")
    os.chmod(host_file, 0o600)
    _, ids = mps.mps_claim(30)
    out = mps.tenant(ids, f"""
        import os
        for name in (".gpushare-sim-mps.tmp", "gpushare-sim-mps.tmp", "gpushare-sim-mps"):
            path = os.environ["VIEW"] + "{PIPE}/" + name
            try:
                if os.path.lexists(path):
                    os.unlink(path)
                os.symlink({str(host_file)!r}, path)
                print("planted", name)
            except OSError as e:
                print("refused:", name, e)
    """)
    print("tenant:", out.strip())
    mps.mps_claim(40)  # the daemon writes its server file for the new ceiling
    assert host_file.read_text() == "precious\n"
    assert stat.S_IMODE(os.stat(host_file).st_mode) == 0o600


# ---- the plugin's side: whom it talks to ---------------------------------------------------------
def test_the_plugin_refuses_a_daemon_whose_peer_credentials_are_not_the_daemons(mps):
    """Where no container can write (the control folder), a host process that replaced the
    daemon's socket still gets nothing: the plugin checks who answers (SO_PEERCRED) against the
    daemon's pid, and says so."""
    ref, _ = mps.mps_claim(30)
    uuid = uuid_of(mps, ref)
    path = mpslayout.control_socket(mps.dirs.state, uuid)
    os.unlink(path)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(path)
    impostor.listen(8)
    try:
        with pytest.raises(MpsError, match="not the control daemon"):
            mps.plugin.driver.mps.command(uuid, mpslayout.GET_SERVERS)
    finally:
        impostor.close()
