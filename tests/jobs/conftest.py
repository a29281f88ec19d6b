"""Fixtures for push delivery: a real HTTP receiver on 127.0.0.1 and an in-process dispatcher loop.

The dispatcher runs ``jobs.push.dispatcher.Engine.run`` in a background thread against the test
database (tests must be ``django_db(transaction=True)`` so it sees committed rows).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

import pytest
from django.db import connection

from tests.helpers import QuietHandler, serve_loopback, stopping, wait_until


@dataclass
class Received:
    path: str
    headers: dict  # lower-cased names
    body: bytes
    at: float  # time.monotonic()
    client_port: int


@dataclass
class Reply:
    status: int = 204
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0  # seconds to wait before answering


class Receiver:
    """Records every request; ``behave(path, fn)`` sets the reply: fn(n, request) -> Reply where n
    counts the requests to that path (1-based). Default: 204."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.behaviours: dict = {}
        self.counts: dict = {}
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                   time.monotonic(), self.client_address[1])
                with receiver.lock:
                    receiver.requests.append(request)
                    n = receiver.counts[self.path] = receiver.counts.get(self.path, 0) + 1
                    receiver.active += 1
                    receiver.max_active = max(receiver.max_active, receiver.active)
                    behave = receiver.behaviours.get(self.path)
                try:
                    reply = behave(n, request) if behave else Reply()
                    if reply.delay:
                        time.sleep(reply.delay)
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with receiver.lock:
                        receiver.active -= 1

        self.server, self.thread = serve_loopback(Handler)
        self.port = self.server.server_address[1]

    def url(self, path: str = "/cb") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def behave(self, path: str, fn) -> None:
        self.behaviours[path] = fn

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def wait(self, predicate, timeout: float = 20.0, what: str = "condition"):
        return wait_until(predicate, timeout, what, detail=lambda: f"; received {len(self.requests)}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def push_settings(settings):
    """Short delays so timing tests run in seconds."""
    settings.BROKER_PUSH_POLL = 0.2
    settings.BROKER_RATIONAL_DELAY = 0.5
    settings.BROKER_CONNECTION_TIMEOUT = 2.0
    settings.BROKER_RETRY_BACKOFF = [0.5, 1.0]
    settings.BROKER_MIN_SCHEDULE_DELAY = 1.0
    return settings


class DispatcherThread:
    """One dispatcher loop (its own Engine, like one worker process) in a background thread."""

    def __init__(self, concurrency: int = 8) -> None:
        from jobs.push.dispatcher import Engine

        self.engine = Engine(concurrency=concurrency)
        self.stop_event = threading.Event()
        self.stats = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.engine.run(claim_for=3600, drain_for=10, stop=self.stop_event)
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc
        finally:
            connection.close()

    def start(self) -> "DispatcherThread":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        os.write(self.engine._wake_w, b"x")
        self.thread.join(timeout=30)
        self.engine.close()
        if self.error:
            raise self.error


@pytest.fixture
def dispatcher(push_settings):
    """Start with ``dispatcher()`` (optionally several, like several worker processes)."""
    with stopping(DispatcherThread) as start:
        yield start


@pytest.fixture
def push_world(make, receiver):
    """Channel ch1 (ch-token), producer p1 (p-token), push consumer c1 -> receiver /cb."""
    make.basics().consumer("c1", callback=receiver.url("/cb"))
    return make


def json_of(response):
    return json.loads(response.content) if response.content else None
