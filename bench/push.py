"""Push delivery benchmark: gunicorn + qcluster + a fast loopback receiver, all real processes.

    .venv/bin/python bench/push.py                       # throw-away embedded PostgreSQL
    .venv/bin/python bench/push.py --messages 20000 --rate 200 --seconds 20
    DATABASE_URL=postgres://... .venv/bin/python bench/push.py   # an existing (migrated here) database
    .venv/bin/python bench/push.py --compare-clients     # today's push client vs the hand-written one

Prints, for a channel with 1 and with 5 push consumers, the deliveries per second of N messages
published in batches (first publish to last callback), then the publish-to-callback latency
p50/p95/p99 at a steady single-message publish rate (one consumer). The receiver is a raw
asyncio HTTP/1.1 server in its own process answering 204; latency is measured from the moment
the publisher sends the request (``X-Sent-At`` metadata header) to the callback's arrival.

``--compare-clients``: the same measurements in one run with the workers restarted in turns on
today's push client (``jobs/callbacks/http.py``, llhttp) and on the hand-written HTTP/1.1 parser it
replaced (that file as of ``--legacy-ref``, read from git and put in place of the module in the
qcluster process before anything imports it), then the ratios. Each worker process records which
client file it built its client from; the run stops if a phase ran the wrong one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import NO_CONTENT, head_header, receiver_serve, smoke_args_parse, smoke_problems_exit  # noqa: E402

ADMIN = "bench-admin-token"
# The last commit whose push client (then jobs/push/http.py) parsed answers by hand (for --compare-clients).
LEGACY_CLIENT_REF = "7fe865567c7a6e99f85b726df0e3722068d9daae"

# qcluster with a chosen push client: BENCH_PUSH_CLIENT_SOURCE (a file) replaces jobs.callbacks.http
# before anything imports it (django-q2 forks its workers, so they inherit the module), and every
# Client built appends "pid file" to BENCH_PUSH_CLIENT_LOG.
QCLUSTER_LAUNCH = """
import importlib.util, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
source = os.environ.get("BENCH_PUSH_CLIENT_SOURCE")
if source:
    import jobs.callbacks
    spec = importlib.util.spec_from_file_location("jobs.callbacks.http", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["jobs.callbacks.http"] = module
    spec.loader.exec_module(module)
else:
    import jobs.callbacks.http as module
log, init = os.environ.get("BENCH_PUSH_CLIENT_LOG"), module.Client.__init__
def traced_init(self, *args, **kwargs):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} {module.__file__}\\n")
    init(self, *args, **kwargs)
if log:
    module.Client.__init__ = traced_init
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "qcluster"])
"""
SMOKE_TABLE = r"^throughput +\d+ consumer\(s\): \d+/\d+ deliveries .*\n(?s:.*)^latency +\d+ consumer\(s\) at .* p50 .* ms"


# --- receiver (own process) ---------------------------------------------------------------------

RICH_BODY = b'{"status":"ok","id":"0123456789abcdef","accepted":true}'
RICH_ANSWER = (b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nServer: bench\r\n"
               b"Content-Type: application/json; charset=utf-8\r\nX-Request-ID: 0123456789abcdef0123456789abcdef\r\n"
               b"Vary: Accept-Encoding\r\nContent-Length: %d\r\n\r\n%s" % (len(RICH_BODY), RICH_BODY))

def _receiver_main(port: int, conn) -> None:
    arrivals: list[float] = []
    latencies: list[float] = []
    seqs: list[int] = []  # X-Seq metadata headers, when the publisher sends them (lost / duplicated)
    sents: list[float] = []  # the X-Sent-At of each latency (bench/capacity.py: latencies by slice of time)

    def answer(head: bytes, body: bytes) -> bytes:
        """204 at once; the arrival counted, with its latency and sequence number when the publisher sent them."""
        if head.startswith(b"post /rich "):  # --compare-clients, client alone: a typical framework answer
            return RICH_ANSWER
        now = time.time()
        arrivals.append(now)
        sent = head_header(head, b"x-sent-at")
        if sent is not None:
            sent = float(sent)
            latencies.append(now - sent)
            sents.append(sent)
        seq = head_header(head, b"x-seq")
        if seq is not None:
            seqs.append(int(seq))
        return NO_CONTENT

    def control():
        while True:
            cmd = conn.recv()
            if cmd == "reset":
                arrivals.clear()
                latencies.clear()
                seqs.clear()
                sents.clear()
                conn.send(True)
            elif cmd == "stats":
                conn.send((len(arrivals), arrivals[0] if arrivals else None, arrivals[-1] if arrivals else None,
                           list(latencies)))
            elif cmd == "count":
                conn.send(len(arrivals))
            elif cmd == "seqs":
                conn.send(list(seqs))
            elif cmd == "timed":
                conn.send(list(zip(sents, latencies)))

    receiver_serve(port, conn, control, answer)


class Receiver:
    def __init__(self) -> None:
        self.port = _free_port()
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_receiver_main, args=(self.port, child), daemon=True)
        self.proc.start()
        assert self.conn.recv() == "ready"

    def ask(self, cmd: str):
        self.conn.send(cmd)
        return self.conn.recv()

    def stop(self) -> None:
        self.proc.kill()


# --- CPU accounting (Linux /proc): less sensitive to a busy machine than wall-clock rates ---------

def _stat(pid: str):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[1]), int(fields[2]), (int(fields[11]) + int(fields[12])) / tick,
                (int(fields[13]) + int(fields[14])) / tick)
    except (OSError, IndexError, ValueError):
        return None  # ppid, pgrp, own cpu seconds, cpu seconds of its children that ended (waited for)


def cpu_by_group(groups: dict) -> dict:
    """CPU seconds used so far by each named group: {"name": ("pgrp", pid) or ("children", pid)}.

    A process's ended children count through its waited-for time (cutime + cstime): a PostgreSQL
    backend or a gunicorn worker that exits between two readings keeps its CPU in the total, which
    stays monotonic."""
    stats = {pid: _stat(pid) for pid in os.listdir("/proc") if pid.isdigit()}
    result = {}
    for name, (kind, root) in groups.items():
        total = 0.0
        for pid, st in stats.items():
            if st is None:
                continue
            ppid, pgrp, cpu, waited = st
            if (kind == "pgrp" and pgrp == root) or (kind == "children" and (ppid == root or int(pid) == root)):
                total += cpu + waited
        result[name] = total
    return result


# --- broker processes -----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args, env, log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL the process group (qcluster can hang on SIGTERM: django-q2 #346)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def web_command(server: str, port: int, workers: int) -> list[str]:
    """The web tier as users run it: gunicorn with gunicorn.conf.py (gthread), or granian (WSGI,
    the same number of workers and threads) for a side-by-side comparison."""
    if server == "granian":
        threads = os.environ.get("BROKER_WEB_THREADS", "32")
        return [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
                "--workers", str(workers), "--blocking-threads", threads, "--backpressure", threads,
                "--log-level", "warning", "broker.wsgi:application"]
    return [sys.executable, "-m", "gunicorn", "broker.wsgi:application"]


class Broker:
    def __init__(self, args, workdir: Path) -> None:
        self.workdir = workdir
        self.server_dir = None
        url = os.environ.get("DATABASE_URL")
        if not url:
            from broker.embedded_db import server_ensure

            self.server_dir = workdir / "pg"
            url = server_ensure(self.server_dir, fsync=not args.no_fsync).url
        self.env = {**os.environ, "DATABASE_URL": url, "DJANGO_SECRET_KEY": "bench-secret-key",
                    "BROKER_ADMIN_TOKEN": ADMIN, "DJANGO_DEBUG": "0", "BROKER_LOG_LEVEL": "WARNING",
                    "BROKER_CALLBACK_ALLOW": "127.0.0.1,::1,localhost",  # the receiver is on loopback
                    "BROKER_WEB_WORKERS": str(args.web_workers), "PYTHONUNBUFFERED": "1"}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=self.env, check=True)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.web = _spawn(web_command(getattr(args, "server", "gunicorn"), port, args.web_workers),
                          {**self.env, "BROKER_BIND": f"127.0.0.1:{port}"}, workdir / "web.log")
        self.workers = self.workers_start()
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{self.url}/_status", timeout=1)
                break
            except requests.RequestException:
                if time.monotonic() > deadline or self.web.poll() is not None:
                    raise RuntimeError((workdir / "web.log").read_text()[-2000:])
                time.sleep(0.2)
        self.session = requests.Session()
        self.session.headers["X-Broker-Admin-Token"] = ADMIN
        if self.session.get(f"{self.url}/producer/bench-producer").status_code == 404:
            r = self.session.put(f"{self.url}/producer/bench-producer", data={"token": "bench-p"})
            assert r.status_code == 200, r.text

    def workers_start(self, client_source: Path | None = None, tag: str = "") -> subprocess.Popen:
        """A qcluster, on today's push client or (``client_source``) on another jobs/callbacks/http.py."""
        if client_source is None and not tag:
            return _spawn([sys.executable, "manage.py", "qcluster"], self.env, self.workdir / "qcluster.log")
        env = {**self.env, "BENCH_PUSH_CLIENT_LOG": str(self.workdir / f"client-{tag}.log")}
        if client_source is not None:
            env["BENCH_PUSH_CLIENT_SOURCE"] = str(client_source)
        return _spawn([sys.executable, "-c", QCLUSTER_LAUNCH], env, self.workdir / f"qcluster-{tag}.log")

    def workers_restart(self, client_source: Path | None, tag: str) -> None:
        _kill(self.workers)
        self.workers = self.workers_start(client_source, tag)

    def setup_channel(self, consumers: int, receiver_port: int, max_in_flight: int | None) -> tuple[str, list[str]]:
        tag = uuid.uuid4().hex[:8]
        channel = f"bench-{consumers}-{tag}"
        s = self.session
        assert s.put(f"{self.url}/channel/{channel}", data={"token": "bench-c"}).status_code == 200
        ids = []
        for i in range(consumers):
            data = {"token": f"t{i}", "callbackUrl": f"http://127.0.0.1:{receiver_port}/{channel}/c{i}"}
            if max_in_flight:
                data["maxInFlight"] = str(max_in_flight)
            r = s.put(f"{self.url}/channel/{channel}/consumer/c{i}", data=data)
            assert r.status_code == 200, r.text
            ids.append(f"c{i}")
        return channel, ids

    def cpu_groups(self, receiver: "Receiver") -> dict:
        groups = {"dispatchers (qcluster)": ("pgrp", self.workers.pid), "web (gunicorn)": ("pgrp", self.web.pid),
                  "receiver": ("children", receiver.proc.pid)}
        if self.server_dir is not None:
            try:
                postmaster = int((self.server_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
                groups["postgres"] = ("children", postmaster)
            except (OSError, ValueError, IndexError):
                pass
        return groups

    def stop(self) -> None:
        _kill(self.workers)
        _kill(self.web)
        if self.server_dir is not None:
            import shutil

            from broker.embedded_db import server_stop

            server_stop(self.server_dir)
            shutil.rmtree(self.server_dir, ignore_errors=True)  # keep only the logs


PUBLISH_HEADERS = {"X-Broker-Channel-Token": "bench-c", "X-Broker-Producer-ID": "bench-producer",
                   "X-Broker-Producer-Token": "bench-p"}


def throughput(broker: Broker, receiver: Receiver, *, consumers: int, messages: int, max_in_flight) -> dict:
    channel, _ = broker.setup_channel(consumers, receiver.port, max_in_flight)
    receiver.ask("reset")
    expected = messages * consumers
    groups = broker.cpu_groups(receiver)
    cpu_before = cpu_by_group(groups)
    session = requests.Session()
    start = time.time()
    batch = 500
    body = json.dumps({"n": 1, "pad": "x" * 200})
    for offset in range(0, messages, batch):
        items = [{"Payload": body, "ContentType": "application/json"} for _ in range(min(batch, messages - offset))]
        r = session.post(f"{broker.url}/channel/{channel}/messages", json=items, headers=PUBLISH_HEADERS)
        assert r.status_code == 201, r.text
    published = time.time()
    deadline = time.monotonic() + max(60.0, expected / 200.0)
    while receiver.ask("count") < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    count, first, last, _ = receiver.ask("stats")
    cpu_after = cpu_by_group(groups)
    cpu = {name: 1e6 * (cpu_after[name] - cpu_before[name]) / max(1, count) for name in groups}
    return {"cpu_us": cpu, "consumers": consumers, "messages": messages, "deliveries": count, "expected": expected,
            "publish_s": published - start, "elapsed_s": (last or start) - start,
            "per_s": count / max(1e-9, (last or start) - start)}


def latency(broker: Broker, receiver: Receiver, *, rate: float, seconds: float, consumers: int,
            max_in_flight) -> dict:
    channel, _ = broker.setup_channel(consumers, receiver.port, max_in_flight)
    receiver.ask("reset")
    total = int(rate * seconds)
    groups = broker.cpu_groups(receiver)
    cpu_before = cpu_by_group(groups)
    wall_before = time.monotonic()
    interval = 1.0 / rate
    local = threading.local()
    errors = []
    publish_times: list[float] = []

    def publish(i: int) -> None:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        headers = {**PUBLISH_HEADERS, "Content-Type": "application/json", "X-Broker-Metadata-Headers": "X-Sent-At",
                   "X-Sent-At": repr(time.time())}
        sent = time.perf_counter()
        r = session.post(f"{broker.url}/channel/{channel}/broadcast", data=b'{"n": 1}', headers=headers)
        publish_times.append(time.perf_counter() - sent)
        if r.status_code != 201:
            errors.append(r.status_code)

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for i in range(total):
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(publish, i)
    achieved = total / (time.monotonic() - start)
    deadline = time.monotonic() + 30
    while receiver.ask("count") < total * consumers and time.monotonic() < deadline:
        time.sleep(0.1)
    count, _, _, lat = receiver.ask("stats")
    cpu_after = cpu_by_group(groups)
    wall = time.monotonic() - wall_before
    cpu_share = {name: 100.0 * (cpu_after[name] - cpu_before[name]) / wall for name in groups}
    lat.sort()

    def pct(p: float, values=lat) -> float:
        return 1000 * values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")

    publish_times.sort()

    return {"consumers": consumers, "rate": rate, "achieved_rate": achieved, "published": total,
            "deliveries": count, "errors": len(errors), "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
            "max_ms": 1000 * lat[-1] if lat else float("nan"),
            "mean_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
            "publish_p50_ms": pct(50, publish_times), "publish_p99_ms": pct(99, publish_times),
            "cpu_share": cpu_share}


def client_check(workdir: Path, tag: str, expected: Path) -> int:
    """How many worker processes built their push client from ``expected``; stops the run if any
    built it from another file (the comparison would be void)."""
    try:
        lines = (workdir / f"client-{tag}.log").read_text().split("\n")
    except OSError:
        lines = []
    files = {line.split(" ", 1)[1] for line in lines if " " in line}
    if files != {str(expected)}:
        raise SystemExit(f"phase {tag}: push clients built from {sorted(files) or 'nothing'}, expected {expected}")
    return sum(1 for line in lines if line)


def legacy_client(ref: str, workdir: Path) -> Path:
    """The push client as of ``ref`` (then jobs/push/http.py: the hand-written parser), written to a file of its own."""
    try:
        source = subprocess.run(["git", "show", f"{ref}:jobs/push/http.py"], cwd=ROOT, check=True,
                                capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"--compare-clients needs git and the commit {ref} in this repository: {exc}")
    path = workdir / "legacy_http.py"
    path.write_bytes(source)
    return path


def print_throughput(result: dict, label: str = "") -> None:
    print(f"throughput  {label}{result['consumers']} consumer(s): {result['deliveries']}/{result['expected']} "
          f"deliveries in {result['elapsed_s']:.2f} s = {result['per_s']:,.0f} deliveries/s "
          f"(publishing took {result['publish_s']:.2f} s)")
    print("            CPU per delivery: " + ", ".join(f"{name} {us:.0f} us" for name, us in result["cpu_us"].items()))


def print_latency(result: dict, label: str = "") -> None:
    print(f"latency     {label}{result['consumers']} consumer(s) at {result['rate']:.0f} msg/s "
          f"(achieved {result['achieved_rate']:.0f}/s, {result['published']} messages, "
          f"{result['deliveries']} callbacks, {result['errors']} publish errors): "
          f"p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
          f"max {result['max_ms']:.1f} ms; the publish request alone: p50 {result['publish_p50_ms']:.1f} ms, "
          f"p99 {result['publish_p99_ms']:.1f} ms")
    print("            CPU use (% of one core): " + ", ".join(f"{name} {pct:.0f}%" for name, pct in result["cpu_share"].items())
          + f"; load average {os.getloadavg()[0]:.1f}")


def client_alone(module, port: int, *, requests: int, concurrency: int, path: str, loop_factory=None) -> dict:
    """``requests`` keep-alive POSTs through ``module.Client`` in this process, ``concurrency`` at a
    time, against the receiver: this process's CPU per request (the client's loop thread does
    all of the work) and requests per second. ``loop_factory``: the client's event loop (default
    its own)."""
    client = module.Client(loop_factory=loop_factory) if loop_factory is not None else module.Client()
    headers = {"Content-Type": "application/json", "X-Broker-Message-ID": "m", "X-Broker-Channel-ID": "c",
               "X-Broker-Consumer-ID": "k", "X-Request-ID": uuid.uuid4().hex, "User-Agent": "bench"}
    body = json.dumps({"n": 1, "pad": "x" * 200}).encode()

    async def one_by_one(n: int) -> None:
        for _ in range(n):
            answer = await client.post(scheme="http", host="127.0.0.1", port=port, path=path, headers=headers,
                                       body=body, timeout=10.0)
            assert 200 <= answer.status < 300, answer.status

    async def run() -> None:
        await asyncio.gather(*[one_by_one(requests // concurrency) for _ in range(concurrency)])

    try:
        asyncio.run_coroutine_threadsafe(run(), client.loop).result()  # warm-up: connections, caches
        cpu, wall = time.process_time(), time.perf_counter()
        asyncio.run_coroutine_threadsafe(run(), client.loop).result()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        client.stop()
    done = requests // concurrency * concurrency
    return {"cpu_us": 1e6 * cpu / done, "per_s": done / wall}


def compare_clients_alone(args, clients: dict, port: int) -> None:
    """Both client modules in this process, alternating, on the 204 the receiver sends to the
    dispatchers and on a typical framework answer (six headers and a JSON body)."""
    import importlib.util

    from django.conf import settings

    if not settings.configured:
        settings.configure(BROKER_CALLBACK_DENY_PRIVATE=False)  # loopback receiver; no policy lookups
    modules = {}
    for name, (source, expected) in clients.items():
        spec = importlib.util.spec_from_file_location(f"bench_client_{len(modules)}", expected)
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    for path, answer in (("/plain", "204 No Content"), ("/rich", "200 with 6 headers and a 56-byte JSON body")):
        samples: dict = {name: [] for name in modules}
        for rnd in range(args.rounds * 2):
            for name in (list(modules) if rnd % 2 == 0 else list(modules)[::-1]):
                samples[name].append(client_alone(modules[name], port, requests=args.client_requests,
                                                  concurrency=args.client_concurrency, path=path))
        cpu = {name: statistics.median(r["cpu_us"] for r in rows) for name, rows in samples.items()}
        rate = {name: statistics.median(r["per_s"] for r in rows) for name, rows in samples.items()}
        print(f"client alone, answer {answer}: {args.client_requests:,} keep-alive POSTs x {args.rounds * 2} per "
              f"client, {args.client_concurrency} at a time, medians: llhttp {cpu['llhttp']:.1f} us CPU/request "
              f"({rate['llhttp']:,.0f}/s), hand-written {cpu['hand-written']:.1f} us ({rate['hand-written']:,.0f}/s); "
              f"CPU ratio llhttp / hand-written {cpu['llhttp'] / cpu['hand-written']:.3f}; "
              f"load average {os.getloadavg()[0]:.1f}")


def compare_loops(args, port: int) -> None:
    """Today's push client alone on the event loop the dispatcher gives it (uvloop) and on asyncio's
    own, alternating: CPU per keep-alive POST of a 204."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(BROKER_CALLBACK_DENY_PRIVATE=False)  # loopback receiver; no policy lookups
    import uvloop

    import jobs.callbacks.http as current

    loops = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    samples: dict = {name: [] for name in loops}
    for rnd in range(args.rounds * 2):
        for name in (list(loops) if rnd % 2 == 0 else list(loops)[::-1]):
            samples[name].append(client_alone(current, port, requests=args.client_requests,
                                              concurrency=args.client_concurrency, path="/plain",
                                              loop_factory=loops[name]))
    cpu = {name: statistics.median(r["cpu_us"] for r in rows) for name, rows in samples.items()}
    print(f"push client alone by event loop: {args.client_requests:,} keep-alive POSTs of a 204 x {args.rounds * 2} "
          f"per loop, {args.client_concurrency} at a time, medians: uvloop {cpu['uvloop']:.1f} us CPU/request, "
          f"asyncio {cpu['asyncio']:.1f} us; CPU ratio uvloop / asyncio {cpu['uvloop'] / cpu['asyncio']:.3f}")


def compare_clients(args, broker: Broker, receiver: Receiver, workdir: Path) -> None:
    """The clients alone, then rounds of (llhttp, hand-written) phases of the whole broker, the order
    swapped every round, then mean ratios."""
    import jobs.callbacks.http as current

    legacy = legacy_client(args.legacy_ref, workdir)
    clients = {"llhttp": (None, Path(current.__file__)), "hand-written": (legacy, legacy)}
    compare_clients_alone(args, clients, receiver.port)
    consumers_list = [int(x) for x in args.consumers.split(",") if x.strip()]
    results: dict = {name: [] for name in clients}
    for rnd in range(args.rounds):
        for name in list(clients) if rnd % 2 == 0 else list(clients)[::-1]:
            source, expected = clients[name]
            tag = f"{rnd}-{name}"
            broker.workers_restart(source, tag)
            time.sleep(2.0)  # let the dispatcher loops start
            label = f"[{name}, round {rnd + 1}] "
            phase = {"load": os.getloadavg()[0]}
            for consumers in consumers_list:
                phase[consumers] = throughput(broker, receiver, consumers=consumers, messages=args.messages,
                                              max_in_flight=args.max_in_flight)
                print_throughput(phase[consumers], label)
            phase["latency"] = latency(broker, receiver, rate=args.rate, seconds=args.seconds,
                                       consumers=args.latency_consumers, max_in_flight=args.max_in_flight)
            print_latency(phase["latency"], label)
            print(f"            {client_check(workdir, tag, expected)} worker processes built their client "
                  f"from {expected}")
            results[name].append(phase)
    loads = ", ".join(f"{phase['load']:.1f}" for name in clients for phase in results[name])
    print(f"\nllhttp client vs hand-written parser (git {args.legacy_ref[:12]}), means of {args.rounds} round(s) "
          f"each; ratio = llhttp / hand-written; load average at the phase starts {loads}")
    dispatchers = "dispatchers (qcluster)"
    rows = []
    for consumers in consumers_list:
        rows.append((f"deliveries/s, {consumers} consumer(s)", lambda p, c=consumers: p[c]["per_s"], "higher"))
        rows.append((f"dispatcher CPU us/delivery, {consumers} consumer(s)",
                     lambda p, c=consumers: p[c]["cpu_us"][dispatchers], "lower"))
    rows.append(("latency p50 ms", lambda p: p["latency"]["p50_ms"], "lower"))
    rows.append(("latency p99 ms", lambda p: p["latency"]["p99_ms"], "lower"))
    rows.append((f"dispatcher CPU % at {args.rate:.0f} msg/s", lambda p: p["latency"]["cpu_share"][dispatchers],
                 "lower"))
    for title, pick, better in rows:
        new, old = (statistics.fmean(pick(phase) for phase in results[name]) for name in clients)
        ratio = new / old if old else float("nan")
        print(f"  {title:<44} llhttp {new:>9,.1f}   hand-written {old:>9,.1f}   ratio {ratio:.3f} ({better} is better)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10000, help="messages per throughput run")
    parser.add_argument("--consumers", default="1,5", help="push consumers per channel, comma-separated")
    parser.add_argument("--rate", type=float, default=200.0, help="steady publish rate for the latency run")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the latency run")
    parser.add_argument("--latency-consumers", type=int, default=1)
    parser.add_argument("--max-in-flight", type=int, default=None, help="consumers' maxInFlight (default: broker's 10)")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    parser.add_argument("--compare-clients", action="store_true",
                        help="measure today's push client and the hand-written parser it replaced in one run, "
                             "alternating, and print the ratios")
    parser.add_argument("--legacy-ref", default=LEGACY_CLIENT_REF,
                        help="git commit whose jobs/callbacks/http.py is the other client (default: the last "
                             "hand-written parser)")
    parser.add_argument("--compare-loops", action="store_true",
                        help="measure today's push client alone on uvloop (as the dispatcher runs it) and on "
                             "asyncio's own event loop, alternating, and print the CPU per request (no broker)")
    parser.add_argument("--rounds", type=int, default=2, help="with --compare-clients: phases per client")
    parser.add_argument("--client-requests", type=int, default=20000,
                        help="with --compare-clients or --compare-loops: POSTs per client-alone sample")
    parser.add_argument("--client-concurrency", type=int, default=32,
                        help="with --compare-clients or --compare-loops: client-alone POSTs in flight")
    args = smoke_args_parse(parser, messages=200, rate=20.0, seconds=2.0)
    problems = []  # counted failures, fatal in --smoke
    if args.compare_loops or args.smoke:  # (the smoke run keeps this mode from rotting: a few POSTs)
        receiver = Receiver()
        try:
            if args.smoke:
                args.rounds, args.client_requests = 1, 320
            compare_loops(args, receiver.port)
        finally:
            receiver.stop()
        if args.compare_loops:
            return

    workdir = Path(tempfile.mkdtemp(prefix="bench-push-"))
    receiver = Receiver()
    broker = Broker(args, workdir)
    try:
        time.sleep(2.0)  # let the dispatcher loops start
        print(f"push benchmark: {os.cpu_count()} CPUs, maxInFlight={args.max_in_flight or 'default (10)'}, "
              f"logs in {workdir}")
        if args.compare_clients:
            compare_clients(args, broker, receiver, workdir)
            return
        for consumers in [int(x) for x in args.consumers.split(",") if x.strip()]:
            result = throughput(broker, receiver, consumers=consumers, messages=args.messages,
                                max_in_flight=args.max_in_flight)
            print_throughput(result)
            if result["deliveries"] < result["expected"] or result["deliveries"] == 0:
                problems.append(f"throughput {consumers}: {result['deliveries']}/{result['expected']} deliveries")
        result = latency(broker, receiver, rate=args.rate, seconds=args.seconds, consumers=args.latency_consumers,
                         max_in_flight=args.max_in_flight)
        print_latency(result)
        if result["errors"] or result["deliveries"] < result["published"] * result["consumers"]:
            problems.append(f"latency: {result['errors']} publish errors, {result['deliveries']} callbacks")
    finally:
        broker.stop()
        receiver.stop()
    if args.smoke:
        smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
