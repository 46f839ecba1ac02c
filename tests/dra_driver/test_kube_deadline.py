"""dra_driver.kube.api_deadline over TLS, as a cluster's API server speaks (issue 40): one deadline
for the whole exchange on a connection the client's pool kept, while the server sends its answer a
TLS record at a time, each long before any read could time out. (A trickled TLS handshake is one
ssl call, which the socket's timeout bounds as a whole already.)"""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
import time

import pytest
from kubernetes import client

from dra_driver import kube

BOUND_S = 1.0
TRICKLE_S = 0.2


class Server(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a Namespace; while `trickle` is set, its body one byte per TLS record,
    one every TRICKLE_S (each record arrives well within any read timeout)."""

    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool keeps the connection
    trickle = threading.Event()
    closed = threading.Event()

    def do_GET(self) -> None:
        body = b'{"kind": "Namespace", "metadata": {"name": "x"}}' + b" " * 100
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self.trickle.is_set():
            self.wfile.write(body)
            return
        for byte in body:
            self.wfile.write(bytes([byte]))  # unbuffered: one TLS record each
            if self.closed.wait(TRICKLE_S):
                return

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def tls_api(tmp_path):
    """(an ApiClient of an HTTPS server, the server's handler class)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    handler = type("Handler", (Server,), {"trickle": threading.Event(), "closed": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"https://127.0.0.1:{server.server_address[1]}"
    cfg.ssl_ca_cert = str(cert)
    api = client.ApiClient(cfg)
    kube.no_request_retries(api)
    yield api, handler
    handler.closed.set()
    api.close()
    server.shutdown()
    server.server_close()


def read(api: client.ApiClient) -> dict:
    with kube.api_deadline(BOUND_S):
        resp = client.CoreV1Api(api).read_namespace("x", _preload_content=False, _request_timeout=BOUND_S)
        return json.loads(kube.read_body(resp, kube.API_BODY_MAX))


def timed_failure(api: client.ApiClient) -> float:
    started = time.monotonic()
    with pytest.raises(kube.ApiDeadlineExceeded, match=f"within {BOUND_S:g} s"):
        read(api)
    return time.monotonic() - started


def test_a_trickled_answer_on_a_kept_connection_ends_at_the_deadline(tls_api):
    api, server = tls_api
    assert read(api)["metadata"]["name"] == "x"  # honest: the pool keeps the connection
    server.trickle.set()
    took = timed_failure(api)
    print(f"a trickled answer on a kept TLS connection: failed after {took:.2f} s (bound {BOUND_S:g} s)")
    assert took < BOUND_S * 1.5
    server.trickle.clear()
    assert read(api)["metadata"]["name"] == "x"  # a new connection once the server answers


def test_a_call_that_ends_in_time_is_untouched(tls_api):
    api, _ = tls_api
    for _ in range(3):
        assert read(api)["metadata"]["name"] == "x"
    time.sleep(BOUND_S * 1.2)  # past the calls' deadlines: their timers were cancelled
    assert read(api)["metadata"]["name"] == "x"
