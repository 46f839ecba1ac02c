"""A hostile API server: a TCP front of a real one (the emulator) that, once turned, answers
requests as no honest server does (issue 40: tests/kubeletplugin/test_api_deadline.py,
tests/controller/test_controller_deadline.py; issue 26: tests/kubeletplugin/test_api_hang.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time

TRICKLE_S = 0.5  # between two bytes of a trickled answer: far below any read timeout, so none trips
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy a to b until either end closes, then shut both down (one direction of a proxy)."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HostileFront:
    """A TCP front of the API server: in mode "pass" it passes bytes both ways to the real one;
    "silent" accepts a connection and never reads or answers (a hung server); else it reads the
    request and "trickle"s an answer a byte every TRICKLE_S (headers and 40 bytes of body: 60 s in
    all), "hang"s after the headers and a few bytes, or "reset"s the connection."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.mode = "pass"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._passed: list[socket.socket] = []  # the connections passed to the real server
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="hostile-front", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            if self.mode == "pass":
                upstream = socket.create_connection(self.target)
                self._conns.append(upstream)
                self._passed += [conn, upstream]
                for a, b in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()
            else:
                threading.Thread(target=self._hostile, args=(conn, self.mode), daemon=True).start()

    def _hostile(self, conn: socket.socket, mode: str) -> None:
        if mode == "silent":
            self._closed.wait()
            return
        try:
            conn.recv(65536)  # the request
            if mode == "reset":  # SO_LINGER 0: close sends RST
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            elif mode == "hang":
                conn.sendall(HEAD + b'{"kind": "Resour')
                self._closed.wait()
            else:
                for byte in HEAD + b"{" + b" " * 40:
                    conn.sendall(bytes([byte]))
                    if self._closed.wait(TRICKLE_S):
                        return
        except OSError:
            pass

    def turn(self, mode: str) -> None:
        """From now on, `mode`; connections passed before are closed (a client's pool must not
        reuse one to reach the real server), hostile ones go on as they were."""
        self.mode = mode
        for conn in self._passed:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        time.sleep(0.1)  # the client sees them closed

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for conn in self._conns:
            conn.close()
