"""The metrics port against hostile clients (issue 40): anyone who reaches --metrics-addr can open
connections. The server was a thread per connection with no timeout: 1,000 idle connections made
1,014 plugin threads (+27 MiB) for as long as they stayed open. Now the connections a client holds
cost no thread, at most MAX_CONNECTIONS are open (a new one closes the oldest still sending its
request), each is closed REQUEST_TIMEOUT_S after it opened however it trickles, and a scrape is
answered meanwhile."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from kubeletplugin import metrics as metrics_module
from kubeletplugin.metrics import Metrics

IDLE = 1000
TIMEOUT_S = 1.0  # the test's whole-exchange bound (10 s in production)


@pytest.fixture
def port(monkeypatch):
    monkeypatch.setattr(metrics_module, "REQUEST_TIMEOUT_S", TIMEOUT_S)
    metrics = Metrics()
    bound = metrics.serve("127.0.0.1:0")
    assert bound
    yield bound
    metrics.stop()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def closed_by_server(conn: socket.socket, wait_s: float) -> bool:
    """The server closed `conn` (end of file or a reset) within wait_s."""
    conn.settimeout(wait_s)
    try:
        while conn.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_idle_connections_hold_no_thread_and_are_closed(port):
    threads, rss = threading.active_count(), rss_kib()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE)]
    try:
        time.sleep(0.3)  # all accepted
        held, grew = threading.active_count() - threads, rss_kib() - rss
        started = time.monotonic()
        body = scrape(port)
        took = time.monotonic() - started
        assert "gpushare_build_info" in body
        print(f"{IDLE} idle connections: +{held} threads, +{grew / 1024:.1f} MiB; a scrape meanwhile took "
              f"{took * 1000:.0f} ms")
        assert held <= metrics_module.SCRAPE_WORKERS, held
        assert took < TIMEOUT_S
        # Each is closed: past MAX_CONNECTIONS at once, the rest once their time is up.
        deadline = time.monotonic() + TIMEOUT_S * 2
        still_open = [c for c in idle if not closed_by_server(c, max(0.0, deadline - time.monotonic()))]
        assert still_open == [], f"{len(still_open)} of {IDLE} idle connections still open"
    finally:
        for conn in idle:
            conn.close()
    assert "gpushare_build_info" in scrape(port)


def test_a_trickled_request_is_cut_at_the_deadline(port):
    """One byte of the request every 0.2 s: a bound per read never trips; the whole exchange's does."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", port)) as conn:
        started = time.monotonic()
        cut = None
        for byte in request:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                cut = time.monotonic() - started
                break
            conn.settimeout(0.2)
            try:
                if conn.recv(1) == b"":
                    cut = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except ConnectionResetError:
                cut = time.monotonic() - started
                break
    print(f"a trickled request: closed after {cut} s (bound {TIMEOUT_S} s)")
    assert cut is not None and cut < TIMEOUT_S + 1.0, cut


def test_an_oversized_request_head_gets_one_clear_error(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(5)
        conn.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (metrics_module.HEAD_MAX + 1) + b"\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 431 "), answer[:200]
    assert f"request head over {metrics_module.HEAD_MAX} bytes".encode() in answer
    assert "gpushare_build_info" in scrape(port)
