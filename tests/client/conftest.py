"""The Python client (client/, import name broker_client) against a real broker: gunicorn as users
run it, on the test database, plus a loopback proxy that injects 503s and dropped connections.

The broker uses short deadlines (BROKER_CONNECTION_TIMEOUT=1, BROKER_RATIONAL_DELAY=0: a claimed
job comes back 1.25 s after its claim unless settled or extended), so lease expiry shows in seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.helpers import QuietHandler, serve_loopback, wait_until
from tests.processes import ROOT, start_web

CLIENT_DIR = ROOT / "client"
try:  # a clean clone without `make test` (which pip-installs ./client): import it from the tree
    import broker_client  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(CLIENT_DIR))

ADMIN = {"X-Broker-Admin-Token": ADMIN_TOKEN}
CHANNEL, CHANNEL_TOKEN = "ch", "ct"
PRODUCER, PRODUCER_TOKEN = "pr", "prt"
CONSUMER, CONSUMER_TOKEN = "pc", "pt"
TOKENS = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": CONSUMER_TOKEN}
SERVER_ENV = dict(BROKER_CONNECTION_TIMEOUT=1, BROKER_RATIONAL_DELAY=0, BROKER_MIN_SCHEDULE_DELAY=1)


def client_env(**extra) -> dict:
    """Environment of a child process using the client (found even when it is not installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CLIENT_DIR), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    for name in list(env):
        if name.startswith("BROKER_") or name in ("XDG_CONFIG_HOME",):
            env.pop(name)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup, django_db_blocker):
    tmp = tmp_path_factory.mktemp("client-web")
    with django_db_blocker.unblock():
        proc = start_web(tmp, workers=2, threads=16, **SERVER_ENV)
    try:
        yield proc
    finally:
        proc.stop()


class World:
    """Channel ch (ct), producer pr (prt) and pull consumer pc (pt), made through the API."""

    def __init__(self, url: str):
        self.url = url
        self.admin = requests.Session()
        self.admin.headers.update(ADMIN)
        self.put(f"/channel/{CHANNEL}", token=CHANNEL_TOKEN)
        self.put(f"/producer/{PRODUCER}", token=PRODUCER_TOKEN)

    def put(self, path: str, **data) -> dict:
        r = self.admin.put(self.url + path, json=data)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def consumer(self, cid: str = CONSUMER, token: str = CONSUMER_TOKEN, **fields) -> dict:
        return self.put(f"/channel/{CHANNEL}/consumer/{cid}", token=token, type=fields.pop("type", "pull"), **fields)

    def producer(self, **kwargs):
        from broker_client import Producer

        return Producer(self.url, CHANNEL, CHANNEL_TOKEN, PRODUCER, PRODUCER_TOKEN, **kwargs)

    def pull_consumer(self, cid: str = CONSUMER, token: str = CONSUMER_TOKEN, url: str | None = None, **kwargs):
        from broker_client import PullConsumer

        return PullConsumer(url or self.url, CHANNEL, cid, CHANNEL_TOKEN, token, **kwargs)

    def stats(self, cid: str = CONSUMER) -> dict:
        r = self.admin.get(f"{self.url}/channel/{CHANNEL}/consumer/{cid}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, predicate, timeout: float = 20.0, what: str = "condition"):
        return wait_until(predicate, timeout, what)


@pytest.fixture
def world(server, transactional_db) -> World:
    w = World(server.url)
    w.consumer()
    return w


class Proxy:
    """A loopback HTTP proxy in front of the broker. ``plan`` maps a path suffix to a list of
    actions taken by successive matching requests: "503" (answer 503 + Retry-After without
    forwarding), "forward-503" (forward, then answer 503 as if the answer was lost), "drop"
    (close the connection without an answer), "forward-drop"; other requests are forwarded."""

    def __init__(self, target: str, retry_after: str = "1"):
        self.target = target
        self.plan: dict[str, list[str]] = {}
        self.seen: list[tuple[str, str, dict, float]] = []  # (method, path, headers, time)
        self.lock = threading.Lock()
        proxy = self

        class Handler(QuietHandler):
            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                with proxy.lock:
                    proxy.seen.append((self.command, self.path, dict(self.headers), time.monotonic()))
                    action = "forward"
                    for suffix, actions in proxy.plan.items():
                        if self.path.split("?")[0].endswith(suffix) and actions:
                            action = actions.pop(0)
                            break
                if action in ("503", "drop"):
                    answer = None
                else:
                    answer = requests.request(self.command, proxy.target + self.path, data=body, headers=headers,
                                              timeout=90, allow_redirects=False)
                if action.endswith("drop"):
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if action.endswith("503"):
                    payload = b'{"error": "database_unavailable", "detail": "injected"}'
                    self.send_response(503)
                    self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.server, self.thread = serve_loopback(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def requests_to(self, suffix: str) -> list:
        with self.lock:
            return [s for s in self.seen if s[1].split("?")[0].endswith(suffix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(server):
    p = Proxy(server.url)
    yield p
    p.close()


def script(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path
