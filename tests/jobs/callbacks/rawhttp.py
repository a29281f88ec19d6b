"""The raw loopback servers of the push-client tests: they answer with exact bytes, so they
accept connections and read requests themselves (the client always sends Content-Length)."""

from __future__ import annotations

import socket
import threading


def request_read(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    """The next request on ``conn`` (head and body) and the bytes after it; None once the client closed."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            return None
        rest += data
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


class LoopbackServer:
    """A listening socket on 127.0.0.1 that counts its connections and serves each in a thread:
    ``serve(conn, *serve_args())``, the arguments taken when the connection is accepted. A
    subclass sets its own attributes before calling ``__init__`` (the accept thread starts here)."""

    def __init__(self) -> None:
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.serve, args=(conn, *self.serve_args()), daemon=True).start()

    def serve_args(self) -> tuple:
        return ()

    def serve(self, conn: socket.socket, *args) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()
