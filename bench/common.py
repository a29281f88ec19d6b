"""Shared benchmark plumbing: a throw-away broker (embedded PostgreSQL + gunicorn as users run it)
and a small asyncio HTTP/1.1 keep-alive client that costs little CPU next to the server.

Also the consumers' side: a lean callback receiver (the broker's push deliveries) and a pull
consumer's loop. Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "bench-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def broker_database():
    """DATABASE_URL if set, else a throw-away embedded PostgreSQL (fsync on, as in production)."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    sys.path.insert(0, str(ROOT))
    from broker.embedded_db import server_ensure, server_stop

    base = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    try:
        server = server_ensure(base)
        yield server.url
    finally:
        server_stop(base)
        shutil.rmtree(base, ignore_errors=True)


def base_env(database_url: str, **extra) -> dict:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url,
        "DJANGO_SECRET_KEY": "bench-secret-key",
        "DJANGO_DEBUG": "0",
        "BROKER_ADMIN_TOKEN": ADMIN,
        "BROKER_LOG_LEVEL": "WARNING",
        "BROKER_CALLBACK_ALLOW": "127.0.0.1,::1,localhost",  # the benchmark receivers listen on loopback
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k: str(v) for k, v in extra.items()})
    return env


def manage(env: dict, *args: str) -> str:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout


class Server:
    def __init__(self, popen, url):
        self.popen = popen
        self.url = url

    def stop(self, grace: float = 5.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def start_gunicorn(env: dict, workers: int = 2, threads: int = 16) -> Server:
    port = free_port()
    popen = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "broker.wsgi:application"], cwd=ROOT,
        env={**env, "BROKER_BIND": f"127.0.0.1:{port}", "BROKER_WEB_WORKERS": str(workers),
             "BROKER_WEB_THREADS": str(threads)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                time.sleep(0.5)
                return Server(popen, url)
        except OSError:
            time.sleep(0.1)
    popen.kill()
    raise RuntimeError("gunicorn did not start")


@contextmanager
def broker_served(*, workers: int = 2):
    """A migrated throw-away broker behind gunicorn: yields (server, database_url); the server
    stops before the database."""
    with broker_database() as database_url:
        env = base_env(database_url)
        manage(env, "migrate", "--verbosity", "0")
        server = start_gunicorn(env, workers=workers)
        try:
            yield server, database_url
        finally:
            server.stop()


# --- a lean keep-alive HTTP client -----------------------------------------------------------------

async def _read_response(reader) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 answer: (status, headers by lower-case name, body). The head is read in one
    call (not a line at a time): the load generators share the machine's two cores with the broker
    they load, and each of their awaits costs CPU the broker's figures would otherwise get."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        raise ConnectionError("connection closed") from exc
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {}
    for line in lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


def build_request(method: str, path: str, headers: dict, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class KeepAlive:
    """One keep-alive connection of an open-loop sender: each request waits for its answer, the
    connection opens on first use and again after a failure (answered as status 0: no answer within
    the timeout, or a cut connection)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self) -> None:
        """Open now rather than on the first request (if this fails, the first request tries again)."""
        try:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            pass

    async def exchange(self, raw: bytes, timeout: float = 60) -> int:
        """Send ``raw`` (a whole request); its answer's status, 0 for none."""
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.write(raw)
            async with asyncio.timeout(timeout):  # (not wait_for: a task per request)
                status, _, _ = await _read_response(self.reader)
            return status
        except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            self.close()
            return 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def run_load(url: str, make_request, total: int, concurrency: int, rate: float | None = None):
    """Send ``total`` requests over ``concurrency`` keep-alive connections; ``make_request(i)``
    returns raw request bytes. Returns (elapsed seconds, {status: count}, latencies)."""
    host, port = url.split("//")[1].split(":")
    counter = iter(range(total))
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    start = time.perf_counter()

    async def worker():
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in counter:
                if rate:
                    due = start + i / rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                t0 = time.perf_counter()
                writer.write(make_request(i))
                status, _, _ = await _read_response(reader)
                latencies.append(time.perf_counter() - t0)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, statuses, latencies


# --- the consumers' side: a lean callback receiver and a pull consumer ------------------------------

NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"


def head_header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case) in a lower-cased request head, or None: the one
    field a receiver reads, without parsing the rest."""
    i = head.find(b"\r\n" + name + b":")
    if i < 0:
        return None
    end = head.find(b"\r\n", i + 2)
    return head[i + len(name) + 3:end if end > 0 else None].strip()


class CallbackProtocol(asyncio.Protocol):
    """HTTP/1.1 requests split on Content-Length and no more parsing, so the receiver costs little CPU
    next to the broker it measures: ``answer(head, body)`` (the head lower-cased) returns the bytes to
    write back, or None to leave the request unanswered; ``connected(transport)`` sees each connection."""

    def __init__(self, answer, connected=None) -> None:
        self.answer, self.connected = answer, connected

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""
        if self.connected is not None:
            self.connected(transport)

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            length = int(head_header(head, b"content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            reply = self.answer(head, body)
            if reply is not None:
                self.transport.write(reply)


def receiver_serve(port: int, conn, control, answer, *, connected=None, backlog: int = 1024) -> None:
    """A receiver process's body: ``CallbackProtocol(answer, connected)`` on 127.0.0.1:``port`` until
    the process is killed, ``control`` (the commands over ``conn``) in a thread of its own; sends
    "ready" over ``conn`` once it listens."""
    async def main():
        server = await asyncio.get_running_loop().create_server(
            lambda: CallbackProtocol(answer, connected), "127.0.0.1", port, backlog=backlog)
        threading.Thread(target=control, daemon=True).start()
        conn.send("ready")
        await server.serve_forever()

    asyncio.run(main())


async def pull_consumer_run(url: str, *, channel: str, consumer: str, channel_token: str, consumer_token: str,
                            batch: int, expires: float, taken, errors: list[int]) -> None:
    """A pull consumer, forever: pull up to ``batch`` jobs (a long poll of ``expires`` s), hand them
    to ``taken(jobs, now)``, ack them DELIVERED with their Receipt; one keep-alive connection, opened
    again after a failure. ``errors[0]`` counts failed pulls and acks and the jobs an ack refused (the
    caller reads and resets it)."""
    host, port = url.split("//")[1].split(":")
    base = f"/channel/{channel}/consumer/{consumer}"
    headers = {"X-Broker-Channel-Token": channel_token, "X-Broker-Consumer-Token": consumer_token,
               "Content-Type": "application/json"}
    pull = json.dumps({"batch": batch, "expires": expires}).encode()
    reader = writer = None
    while True:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(build_request("POST", f"{base}/pull", headers, pull))
            status, _, body = await _read_response(reader)
            now = time.time()
            if status != 200:
                errors[0] += 1
                await asyncio.sleep(0.2)
                continue
            jobs = json.loads(body)["Result"]
            if not jobs:
                continue
            taken(jobs, now)
            ack = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED", "Receipt": j["Receipt"]} for j in jobs]}
            writer.write(build_request("POST", f"{base}/ack", headers, json.dumps(ack).encode()))
            status, _, body = await _read_response(reader)
            results = json.loads(body).get("Result", []) if status == 200 else []
            errors[0] += (status != 200) + sum(1 for r in results if r.get("Error"))
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError):
            errors[0] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.2)


async def commands_serve(conn, answer, *, beside) -> None:
    """A load process's loop: each command over ``conn`` (a tuple, its name first) answered with
    ``await answer(cmd)`` until "stop", the coroutine ``beside`` (the pull consumer) running meanwhile;
    "stop" cancels it and answers True."""
    loop = asyncio.get_running_loop()
    running = loop.create_task(beside)
    while True:
        cmd = await loop.run_in_executor(None, conn.recv)
        if cmd[0] == "stop":
            running.cancel()
            conn.send(True)
            return
        conn.send(await answer(cmd))


def parts_stop(*parts) -> None:
    """Stop what a run started, in the order given (what depends on a part before it: the load, the
    broker, its receiver), however the run ended; a part still None never started."""
    for part in parts:
        if part is not None:
            part.stop()


def wait_for(predicate, timeout: float, what: str, *, interval: float = 0.1, error=RuntimeError, detail=lambda: ""):
    """Poll ``predicate`` every ``interval`` s until it returns something true (returned); ``error``
    naming ``what`` (and ``detail()``) once ``timeout`` seconds pass first. The tests' waits too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise error(f"timed out after {timeout:g} s waiting for {what}{detail()}")


def http_ready(popen, url: str, output, *, timeout: float = 60.0, name: str = "server") -> None:
    """Wait until ``url``/_status answers; RuntimeError with the end of ``output()`` if the process
    exits or ``timeout`` passes first."""
    def answers() -> bool:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited: {output()[-3000:]}")
        try:
            requests.get(f"{url}/_status", timeout=1)
            return True
        except requests.RequestException:
            return False
    wait_for(answers, timeout, f"{name} to answer", interval=0.2, detail=lambda: f": {output()[-3000:]}")


def percentile(values, p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(p / 100 * (len(ordered) - 1)))))
    return ordered[k]


# --- smoke mode: every script runs its own code paths at tiny sizes (tests/system/bench/test_smoke.py) ------
#
# Convention for every bench/<name>.py (the test globs them, so a new script is covered at once):
#   - parse its arguments with ``smoke_args_parse(parser, <size>=<tiny value>, ...)``, which adds
#     ``--smoke`` (those sizes replace the defaults; explicit options still win);
#   - define ``SMOKE_TABLE``, a regular expression (re.MULTILINE) that its printed table matches;
#   - exit non-zero on any error or failed request (``smoke_problems_exit`` for the ones that are
#     counted rather than raised).


def sizes_add(parser: argparse.ArgumentParser, **defaults) -> None:
    """``--name`` options (``spec_seconds`` is ``--spec-seconds``), each of its default's type; a
    default may come as ``(default, help)``."""
    for name, default in defaults.items():
        default, help_text = default if isinstance(default, tuple) else (default, None)
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=help_text)


def smoke_args_parse(parser: argparse.ArgumentParser, **sizes) -> argparse.Namespace:
    """Parse the command line; with ``--smoke`` the options named in ``sizes`` that were left at
    their defaults take the tiny values, so the same code runs in seconds."""
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, a few seconds: checks that the benchmark still runs (CI)")
    args = parser.parse_args()
    if args.smoke:
        for name, value in sizes.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def smoke_problems_exit(*, problems: list[str]) -> None:
    """Exit 1 naming each problem (lost deliveries, failed requests) when there is any."""
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr, flush=True)
    if problems:
        sys.exit(1)


def registry_create(*, channels: list[str], producers: list[str], consumers: list[tuple[str, str, str, str]]) -> None:
    """Channels, producers and consumers (channel, id, type, callback URL) through the broker's own
    services, as PUT would create them: new NOT NULL columns get their values from the model, so
    scripts that bulk-insert messages and jobs with SQL need no change when the registry grows.
    Django must be set up (``BROKER_CALLBACK_ALLOW`` must allow loopback callbacks)."""
    from broker.models import Channel
    from broker.registry import Precondition, channel_upsert, producer_upsert
    from consumers.services import consumer_upsert

    create = Precondition(None)  # never read on create
    for channel_id in channels:
        channel_upsert(channel_id=channel_id, name=None, token=f"{channel_id}-token", precondition=create)
    for producer_id in producers:
        producer_upsert(producer_id=producer_id, name=None, token=f"{producer_id}-token", precondition=create)
    for channel_id, consumer_id, type_, callback_url in consumers:
        consumer_upsert(channel=Channel.objects.get(channel_id=channel_id), consumer_id=consumer_id, name=None,
                        token=f"{consumer_id}-token", callback_url=callback_url or None, type=type_, settings={},
                        precondition=create)


def django_setup(database_url: str) -> None:
    """Django in this process against ``database_url`` (the environment a bench child gets)."""
    os.environ.update(base_env(database_url))
    os.environ["DJANGO_SETTINGS_MODULE"] = "broker.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# --- event types (issue 37): the 20-property schema of bench/capacity.py --event-schema and
# bench/schemas.py, and payloads that validate against it ---------------------------------------------
EVENT_TYPE = "order.created"
EVENT_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["i", "t", "pad", "id", "type", "created_at", "customer", "amount", "currency", "items", "status",
                 "notes", "tags", "paid", "source", "version", "region", "priority", "coupon", "metadata"],
    "properties": {
        "i": {"type": "integer", "minimum": 0}, "t": {"type": "number"}, "pad": {"type": "string"},
        "id": {"type": "string", "pattern": "^ord_[0-9a-z]{6,}$"},
        "type": {"enum": ["order.created", "order.updated"]},
        "created_at": {"type": "string", "format": "date-time"},
        "customer": {"type": "object", "required": ["id", "email"], "additionalProperties": False,
                     "properties": {"id": {"type": "string"}, "email": {"type": "string", "format": "email"},
                                    "name": {"type": "string", "maxLength": 200}}},
        "amount": {"type": "number", "minimum": 0}, "currency": {"enum": ["EUR", "USD", "GBP"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 100,
                  "items": {"type": "object", "required": ["sku", "quantity", "price"],
                            "properties": {"sku": {"type": "string", "minLength": 1},
                                           "quantity": {"type": "integer", "minimum": 1},
                                           "price": {"type": "number", "minimum": 0}}}},
        "status": {"enum": ["new", "paid", "shipped"]}, "notes": {"type": "string", "maxLength": 2000},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "paid": {"type": "boolean"},
        "source": {"type": "string"}, "version": {"type": "integer", "const": 2},
        "region": {"enum": ["eu", "us", "ap"]}, "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        "coupon": {"type": ["string", "null"]},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def event_payload(i: int, t: float, pad: str) -> dict:
    """A payload that validates against ``EVENT_SCHEMA``, carrying the sequence number ``i``, the send
    time ``t`` and ``pad`` as bench/capacity.py's plain payload does."""
    return {"i": i, "t": t, "pad": pad, "id": f"ord_{i:06d}", "type": EVENT_TYPE, "created_at": "2026-01-02T03:04:05Z",
            "customer": {"id": "cus_1", "email": "buyer@example.com", "name": "A Buyer"}, "amount": 42.5,
            "currency": "EUR", "items": [{"sku": "A-1", "quantity": 1, "price": 40.0},
                                         {"sku": "B-2", "quantity": 2, "price": 1.25}],
            "status": "new", "notes": "", "tags": ["web"], "paid": False, "source": "bench", "version": 2,
            "region": "eu", "priority": 3, "coupon": None, "metadata": {"campaign": "spring"}}
