"""Helpers shared by the suites: polling with a deadline, quiet loopback HTTP servers, and fixtures
that start background threads and stop them at the end of a test."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import wait_for


def wait_until(predicate, timeout: float = 20.0, what: str = "condition", detail=lambda: ""):
    """Poll ``predicate`` every 50 ms until it returns something true (returned); AssertionError
    naming ``what`` (and ``detail()``) when ``timeout`` seconds pass first."""
    return wait_for(predicate, timeout, what, interval=0.05, error=AssertionError, detail=detail)


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, no access log on stderr (the receivers and proxies of the tests)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


def serve_loopback(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """A threaded server on 127.0.0.1 (a free port), serving in a daemon thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@contextmanager
def stopping(factory):
    """Yields ``start(*args)``: builds ``factory(*args).start()``; every one started is stopped on exit."""
    started = []

    def start(*args, **kwargs):
        thing = factory(*args, **kwargs).start()
        started.append(thing)
        return thing

    try:
        yield start
    finally:
        for thing in started:
            thing.stop()


def seed_one_channel(consumers: str) -> str:
    """A seed INI with one channel ``ch`` (token ``ch-token``) and the given consumer sections."""
    return "[initial-channels]\nch=Channel\n[initial-channel-tokens]\nch=ch-token\n" + consumers.lstrip("\n")


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


def admin_form_data(response, **changes) -> dict:
    """An admin change form's current values with ``changes``, as a browser posts them back (an
    unchecked box is not sent at all)."""
    form = response.context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        data[name] = "" if value is None else (value.pk if hasattr(value, "pk") else value)
    data.update(changes)
    return {name: value for name, value in data.items() if value is not False}
