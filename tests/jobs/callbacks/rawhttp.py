"""The raw loopback servers of the push-client tests: they answer with exact bytes, so they
accept connections (``tests.helpers.LoopbackServer``) and read requests themselves (the client
always sends Content-Length)."""

from __future__ import annotations

import socket


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
