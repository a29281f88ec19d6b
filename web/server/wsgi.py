"""The WSGI side of the server: a request's call of the application in a pool thread
(``wsgi_call``), its body as ``wsgi.input`` (``RequestBody``) and its answer (``_Answer``).

An answer the application gives whole (Django's usual ``HttpResponse``) goes to the event loop in
one hand-over with its head; a longer one (a file, a streamed response) in pieces of ``FLUSH``
bytes, chunked when it has no Content-Length (HTTP/1.1), the thread waiting while the client does
not take them (``Limits.write``).
"""

from __future__ import annotations

import logging
import time

from web.server.http import Connection, Request, Server

logger = logging.getLogger("gunicorn.error")

FLUSH = 64 * 1024  # bytes of a streamed answer gathered before they go to the loop
QUEUED_MAX = 1024 * 1024  # bytes of a streamed answer handed over and not yet written: the thread waits
NO_BODY = (204, 304)
SERVER_ERROR = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n",
                b"Internal Server Error\n")


class ClientGone(OSError):
    """The connection ended (or timed out) while the application read the body or wrote the answer."""


class RequestBody:
    """``wsgi.input``: the request's body as the connection receives it (any pool thread)."""

    def __init__(self, conn: Connection, req: Request) -> None:
        self.conn = conn
        self.req = req

    def _take(self, size: int) -> bytes:
        """Up to ``size`` bytes (-1: all) of what has arrived (the lock held)."""
        body = self.req.body
        if size < 0 or size >= len(body):
            data = bytes(body)
            body.clear()
        else:
            data = bytes(body[:size])
            del body[:size]
        self.conn.buffered -= len(data)
        return data

    def _wait(self) -> None:
        """Wait for more of the body (the lock held); ClientGone when it cannot come."""
        conn, req = self.conn, self.req
        if req.expect_continue and not req.continue_sent:
            conn.continue_threadsafe(req)
        if conn.reading_paused:
            conn.loop.call_soon_threadsafe(conn.resume_if_drained)
        received = req.received
        deadline = time.monotonic() + conn.server.limits.body
        while not req.body and not req.complete:
            if req.read_error or conn.closed:
                raise ClientGone(req.read_error or "the client closed the connection")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientGone("timed out reading the request body")
            conn.readable.wait(left)
            if req.received != received:
                received, deadline = req.received, time.monotonic() + conn.server.limits.body

    def read(self, size: int = -1) -> bytes:
        if size is None:
            size = -1
        parts = []
        with self.conn.lock:
            while True:
                data = self._take(size)
                if data:
                    parts.append(data)
                    if size >= 0:
                        size -= len(data)
                if size == 0 or (self.req.complete and not self.req.body):
                    break
                self._wait()
        return b"".join(parts)

    def readline(self, size: int = -1) -> bytes:
        if size is None:
            size = -1
        with self.conn.lock:
            while True:
                body = self.req.body
                end = body.find(b"\n") + 1
                if end or self.req.complete or 0 <= size <= len(body):
                    take = end or len(body)
                    return self._take(take if size < 0 else min(take, size))
                self._wait()

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, total = [], 0
        while line := self.readline():
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self):
        while line := self.readline():
            yield line


class _Answer:
    """What the application answers: ``start_response`` and the body's pieces, handed to the loop."""

    __slots__ = ("server", "conn", "req", "status", "headers", "head", "parts", "size", "length", "chunked",
                 "head_sent")

    def __init__(self, server: Server, conn: Connection, req: Request) -> None:
        self.server, self.conn, self.req = server, conn, req
        self.status = None
        self.headers = None
        self.parts: list[bytes] = []
        self.size = 0
        self.length: int | None = None  # the application's Content-Length
        self.chunked = False
        self.head_sent = False

    def start_response(self, status: str, headers, exc_info=None):
        if exc_info is not None:
            try:
                if self.head_sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response called twice without exc_info")
        self.status, self.headers = status, headers
        return self.write

    def write(self, data: bytes) -> None:
        if not self.status:
            raise AssertionError("write() before start_response()")
        if data:
            self.parts.append(data)
            self.size += len(data)
            if self.size >= FLUSH:
                self.flush(last=False)

    def _head(self, last: bool, size: int) -> bytes:
        lines = ["HTTP/1.1 ", self.status, "\r\n"]
        for name, value in self.headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name:
                raise ValueError(f"invalid response header {name!r}")
            lower = name.lower()
            if lower == "content-length":
                self.length = int(value)
            elif lower in ("connection", "transfer-encoding", "date", "keep-alive"):
                continue  # hop-by-hop and Date: the server's
            lines += (name, ": ", value, "\r\n")
        status = int(self.status[:3])
        if self.length is None and status not in NO_BODY and status >= 200 and self.req.method != "HEAD":
            if last:
                lines += ("Content-Length: ", str(size), "\r\n")
            elif self.req.version != "1.0":
                self.chunked = True
                lines.append("Transfer-Encoding: chunked\r\n")
            else:
                self.conn.close_after = True  # an HTTP/1.0 body without a length ends with the connection
        return "".join(lines).encode("latin-1")

    def flush(self, *, last: bool) -> None:
        data = b"".join(self.parts)
        self.parts.clear()
        head = None
        if not self.head_sent:
            head = self._head(last, len(data))
            self.head_sent = True
        if self.chunked:
            data = (b"%x\r\n%b\r\n" % (len(data), data) if data else b"") + (b"0\r\n\r\n" if last else b"")
        self.size = 0
        conn, loop = self.conn, self.conn.loop
        if head is not None and last:
            loop.call_soon_threadsafe(_answered, self.server, conn, self.req, head, data)
            return
        self._queue(len(data))
        if head is not None:
            loop.call_soon_threadsafe(_head_sent, conn, self.req, head, data)
        else:
            loop.call_soon_threadsafe(conn.send_more, self.req, data)
        if last:
            loop.call_soon_threadsafe(_finished, self.server, conn, self.req)

    def _queue(self, n: int) -> None:
        """Account ``n`` bytes handed to the loop; wait while too much waits to be written."""
        conn = self.conn
        deadline = time.monotonic() + conn.server.limits.write
        with conn.lock:
            conn.queued += n
            while conn.queued > QUEUED_MAX or not conn.writable.is_set():
                if conn.closed:
                    raise ClientGone("the client closed the connection")
                left = deadline - time.monotonic()
                if left <= 0:
                    conn.loop.call_soon_threadsafe(conn.abort)
                    raise ClientGone("the client did not read the answer")
                conn.readable.wait(left)  # (resume_writing and send_more notify)


def _head_sent(conn: Connection, req: Request, head: bytes, data: bytes) -> None:
    conn.send_head(req, head, b"", last=False)
    conn.send_more(req, data)


def _answered(server: Server, conn: Connection, req: Request, head: bytes, data: bytes) -> None:
    server.wsgi_done()
    conn.answer(req, head, data)


def _finished(server: Server, conn: Connection, req: Request) -> None:
    server.wsgi_done()
    conn.finish(req)


def wsgi_call(server: Server, conn: Connection, req: Request) -> None:
    """(pool thread) The application's answer to ``req``."""
    environ = req.environ
    environ["wsgi.input"] = RequestBody(conn, req)
    answer = _Answer(server, conn, req)
    loop = conn.loop
    try:
        result = server.app(environ, answer.start_response)
        try:
            for data in result:
                if data:
                    answer.write(data)
            if not answer.status:
                raise AssertionError("the application returned without start_response()")
            answer.flush(last=True)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    except ClientGone as exc:
        logger.debug("request %s %s: %s", req.method, environ.get("RAW_URI"), exc)
        loop.call_soon_threadsafe(_gone, server, conn, req)
    except Exception:  # noqa: BLE001 - an application error: 500 (if nothing was sent yet) and logged
        logger.exception("Error handling request %s %s", req.method, environ.get("RAW_URI"))
        if answer.head_sent:
            loop.call_soon_threadsafe(_gone, server, conn, req)
        else:
            loop.call_soon_threadsafe(_answered, server, conn, req, *SERVER_ERROR)
    except BaseException:  # SystemExit, KeyboardInterrupt in a thread: drop the connection, pass it on
        loop.call_soon_threadsafe(_gone, server, conn, req)
        raise


def _gone(server: Server, conn: Connection, req: Request) -> None:
    server.wsgi_done()
    conn.close_after = True
    conn.abort()
    if not req.answered:
        conn.finish(req)

