"""The web server (web.server) in this process: a real event loop (uvloop) in a thread, a real
listening socket on loopback, raw HTTP/1.1 bytes from the tests."""

from __future__ import annotations

import asyncio
import socket
import threading
from contextlib import contextmanager

import pytest
import uvloop
from django.core.wsgi import get_wsgi_application
from django.db import connection

from web.server.http import Limits, Server
from web.server.native import NATIVE_ROUTES, Native
from web.server.wsgi import wsgi_call


class Served:
    """A ``Server`` for ``app`` on a free loopback port, its loop in a thread of its own."""

    def __init__(self, app, *, native=None, limits: Limits = Limits(), threads: int = 4, **kwargs) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.loop = uvloop.new_event_loop()
        self.threads = threads
        self.server = Server(app=app, loop=self.loop, threads=threads, limits=limits, native=native,
                             runner=wsgi_call, **kwargs)
        if native is not None:
            native.attach(self.server)
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start([self.sock]))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(10)

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def call(self, fn, *args):
        """``fn(*args)`` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop).result(10)

    def shutdown(self, grace: float) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(grace), self.loop).result(grace + 10)

    def close_pool_connections(self) -> None:
        """Close the database connection of every pool thread (before the test database goes)."""
        barrier = threading.Barrier(self.threads + 1)

        def close():
            connection.close()
            barrier.wait(10)

        for _ in range(self.threads):
            self.server.executor.submit(close)
        try:
            barrier.wait(10)
        except threading.BrokenBarrierError:
            pass

    def stop(self) -> None:
        if not self.loop.is_closed():
            try:
                self.shutdown(0.5)
            except Exception:  # noqa: BLE001 - already stopped
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


async def _call(fn, *args):
    return fn(*args)


class Response:
    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes = b"", chunks: int = 0) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.chunks = chunks

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return values[0] if values else None


class Reader:
    """Reads the answers of one connection in order, each framed as HTTP/1.1 says (Content-Length,
    chunked, or to the end of the connection)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buffer += data
        return True

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._more():
                raise ConnectionError("closed in a body")
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._more():
                raise ConnectionError("closed in a chunk")
        end = self.buffer.index(b"\r\n")
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 2]
        return line

    def response(self, *, head: bool = False) -> Response:
        """The next answer (``head``: of a HEAD request, no body); a 100 Continue is its own."""
        while b"\r\n\r\n" not in self.buffer:
            if not self._more():
                raise ConnectionError("closed before a head")
        end = self.buffer.index(b"\r\n\r\n")
        raw = bytes(self.buffer[:end])
        del self.buffer[:end + 4]
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        response = Response(status, headers)
        if head or status < 200 or status in (204, 304):
            return response
        if response.header("Transfer-Encoding") == "chunked":
            parts = []
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    self._line()
                    response.body = b"".join(parts)
                    return response
                parts.append(self._take(size))
                response.chunks += 1
                self._take(2)
        length = response.header("Content-Length")
        if length is not None:
            response.body = self._take(int(length))
            return response
        while self._more():
            pass
        response.body, self.buffer = bytes(self.buffer), bytearray()
        return response

    def closed(self, timeout: float = 5.0) -> bool:
        """Whether the server closed the connection (nothing more than EOF arrives)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


@pytest.fixture
def serve():
    """``serve(app, **options)`` -> a running ``Served``; all stopped after the test."""
    started: list[Served] = []

    def make(app, **options) -> Served:
        served = Served(app, **options)
        started.append(served)
        return served

    yield make
    for served in started:
        served.stop()


@contextmanager
def served_natively(serve):
    """The broker's WSGI app served with the native routes (``Native``): (served, routes); the
    server's pool connections closed and the routes detached after the block."""
    native = Native(NATIVE_ROUTES)
    served = serve(get_wsgi_application(), native=native)
    try:
        yield served, native
    finally:
        served.close_pool_connections()
        native.detach()
