"""A production PostgreSQL's bad days (issue 23), with real processes: a primary and a synchronous
standby (streaming replication, ``synchronous_standby_names``) from the machine's PostgreSQL 15 on
loopback; the broker (two gunicorn web processes, one qcluster) on the multi-host URL
``postgres://...@<proxy>,<standby>/broker?target_session_attrs=read-write``, the primary reached
through a loopback TCP proxy of this test; publishers that retry the same ``X-Broker-Message-ID``
on failure, a push receiver and two pullers of a pull consumer. One cluster, three scenarios in turn:

(a) ``pg_terminate_backend`` on every broker connection every 2 s for 15 s;
(c) 100 ms of added latency in the proxy, then the proxy silently dropping everything for 20 s;
(b) SIGKILL of the primary (all its processes), then the standby promoted.

For each: 0 acknowledged (201) messages lost at either consumer, no answer 500, no broker process
restarted, and publishing answers 201 again within 10 s of the fault's end. Prints per scenario:
acknowledged, lost, seconds until publishing worked again, the answers seen during the fault.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
import requests

from broker.embedded_db import _run_as
from tests.conftest import ADMIN_TOKEN
from tests.helpers import LoopbackServer, QuietHandler
from tests.processes import ROOT, child_env, free_port, start_qcluster, start_web, wait_for

pytestmark = [pytest.mark.slow]

PG_BIN = Path(os.environ.get("BROKER_HA_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "broker"
RECOVERY_MAX = 10.0  # seconds: publishing answers 201 again within this of the fault's end (issue 23)
PUBLISHERS = 3
RATE = 30.0  # publishes per second over all publishers
ADMIN = {"X-Broker-Admin-Token": ADMIN_TOKEN}
CH, CH_TOKEN, P_TOKEN, PULL_TOKEN = "ha", "ha-ch", "ha-p", "ha-pull"
CHILD_ENV = {
    "BROKER_ADMIN_TOKEN": ADMIN_TOKEN,
    "BROKER_Q_WORKERS": "2",
    "BROKER_PUSH_DISPATCHERS": "1",
    "BROKER_PUSH_POLL": "0.5",
    "BROKER_PUSH_LOOP_SECONDS": "15",
    "BROKER_LOG_LEVEL": "WARNING",
}


# --- the database cluster ------------------------------------------------------------------------

def _pg(*args, check=True, **kw):
    return subprocess.run([str(PG_BIN / args[0]), *map(str, args[1:])], check=check, capture_output=True,
                          text=True, timeout=120, **_run_as(), **kw)


class Cluster:
    """A primary and its synchronous standby under a throw-away folder, as the server's user."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="broker-ha-"))
        self.base.chmod(0o755)
        run_as = _run_as()
        if run_as:
            os.chown(self.base, run_as["user"], run_as["group"])
        self.primary, self.standby = self.base / "primary", self.base / "standby"
        self.p_port, self.s_port = free_port(), free_port()

    def _start(self, pgdata: Path, port: int, extra: str = "") -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {self.base} -c max_connections=200 "
                   "-c fsync=off -c full_page_writes=off -c wal_level=replica -c max_wal_senders=5 "
                   "-c hot_standby=on -c wal_sender_timeout=5s -c wal_receiver_timeout=5s " + extra)
        _pg("pg_ctl", "-D", pgdata, "-w", "-t", "60", "-l", pgdata / "server.log", "-o", options, "start")

    def start(self) -> None:
        _pg("initdb", "-D", self.primary, "--auth=trust", "-U", USER, "--no-instructions", "--encoding=UTF8")
        self._start(self.primary, self.p_port)
        with psycopg.connect(host="127.0.0.1", port=self.p_port, user=USER, dbname="postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE broker")  # (before the standby: a synchronous commit would wait for it)
        _pg("pg_basebackup", "-h", "127.0.0.1", "-p", self.p_port, "-U", USER, "-D", self.standby, "-R",
            "-X", "stream", "-c", "fast")
        self._start(self.standby, self.s_port,
                    f"-c primary_conninfo='host=127.0.0.1 port={self.p_port} user={USER} application_name=standby1'")
        self.sql(self.p_port, "ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
        self.sql(self.p_port, "SELECT pg_reload_conf()")
        assert wait_for(lambda: self.sql(self.p_port, "SELECT sync_state FROM pg_stat_replication") == [("sync",)], 30)

    def sql(self, port: int, statement: str, params=None) -> list:
        with psycopg.connect(host="127.0.0.1", port=port, user=USER, dbname="broker", autocommit=True,
                             connect_timeout=3) as c:
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def kill_primary(self) -> None:
        """SIGKILL the postmaster and every process of it (the machine dies)."""
        pid = int((self.primary / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for p in [pid, *map(int, children)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def promote(self) -> None:
        _pg("pg_ctl", "-D", self.standby, "-w", "-t", "60", "promote")

    def stop(self) -> None:
        for pgdata in (self.primary, self.standby):
            if (pgdata / "postmaster.pid").exists():
                _pg("pg_ctl", "-D", pgdata, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.base, ignore_errors=True)


class Proxy(LoopbackServer):
    """A loopback TCP proxy to the primary: ``latency`` seconds added to each direction's data,
    ``dropping`` holds everything (nothing forwarded, nothing closed: a silent network), new
    connections included."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.latency = 0.0
        self.dropping = threading.Event()
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        while self.dropping.is_set():
            time.sleep(0.05)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=3)
            upstream.settimeout(None)
        except OSError:
            client.close()  # the primary is gone: refused, as a dead host's port would be
            return
        for a, b in ((client, upstream), (upstream, client)):
            q: queue.Queue = queue.Queue()
            threading.Thread(target=self._read, args=(a, b, q), daemon=True).start()
            threading.Thread(target=self._write, args=(a, b, q), daemon=True).start()

    def _read(self, src, dst, q) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            q.put((time.monotonic() + self.latency, data))
            if not data:
                return

    def _write(self, src, dst, q) -> None:
        while True:
            due, data = q.get()
            while self.dropping.is_set() or time.monotonic() < due:
                time.sleep(min(0.01, max(0.001, due - time.monotonic())))
            try:
                if not data:
                    raise OSError
                dst.sendall(data)
            except OSError:
                for s in (src, dst):
                    try:
                        s.close()
                    except OSError:
                        pass
                return


# --- the load ------------------------------------------------------------------------------------

class Ledger(ThreadingHTTPServer):
    """The push consumer: answers 200 and counts message ids."""

    daemon_threads = True

    def __init__(self):
        self.seen: Counter = Counter()
        self.lock = threading.Lock()
        ledger = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with ledger.lock:
                    ledger.seen[self.headers.get("X-Broker-Message-Id", "")] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), Handler)

    def handle_error(self, request, client_address):
        pass


class Publishers:
    """Threads publishing messages at ``RATE`` in all; a message that is not answered 201 is sent
    again with the same X-Broker-Message-ID (on the other web process) until it is."""

    def __init__(self, urls):
        self.urls = urls
        self.acked: dict[str, float] = {}  # message id -> monotonic time of its 201
        self.answers: list[tuple[float, str]] = []  # (monotonic time of the answer, status or error)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(PUBLISHERS)]

    def _run(self, index: int) -> None:
        session, n, interval = requests.Session(), 0, PUBLISHERS / RATE
        while not self.stop.is_set():
            mid, n = f"m{index}-{n}", n + 1
            for attempt in range(1000):
                if self.stop.is_set():
                    return
                url = self.urls[(n + attempt) % len(self.urls)]
                try:
                    r = session.post(f"{url}/channel/{CH}/broadcast", data=json.dumps({"n": mid}), timeout=(3, 30),
                                     headers={"Content-Type": "application/json", "X-Broker-Channel-Token": CH_TOKEN,
                                              "X-Broker-Producer-ID": "ha-p", "X-Broker-Producer-Token": P_TOKEN,
                                              "X-Broker-Message-ID": mid})
                    outcome = str(r.status_code)
                except requests.RequestException as exc:
                    outcome, session = type(exc).__name__, requests.Session()
                now = time.monotonic()
                # a 409 on a retry: an earlier attempt's commit landed (on the old primary, replicated to
                # the promoted standby) though its answer was lost; the message is stored: acknowledged
                stored = outcome == "201" or (outcome == "409" and attempt > 0)
                with self.lock:
                    self.answers.append((now, outcome))
                    if stored:
                        self.acked[mid] = now
                if stored:
                    break
                time.sleep(0.2)
            time.sleep(interval)


class Puller(threading.Thread):
    """A client of the pull consumer: pull (short long-poll), record, ack with the receipts; a failed
    ack is retried."""

    def __init__(self, urls, seen: Counter, answers: list):
        super().__init__(daemon=True)
        self.urls, self.seen, self.answers = urls, seen, answers
        self.stop = threading.Event()
        self.headers = {"X-Broker-Channel-Token": CH_TOKEN, "X-Broker-Consumer-Token": PULL_TOKEN}

    def _post(self, n: int, what: str, body: dict):
        url = self.urls[n % len(self.urls)]
        try:
            r = requests.post(f"{url}/channel/{CH}/consumer/puller/{what}", json=body, headers=self.headers,
                              timeout=(3, 30))
        except requests.RequestException as exc:
            self.answers.append((time.monotonic(), type(exc).__name__))
            return None
        self.answers.append((time.monotonic(), str(r.status_code)))
        return r.json() if r.status_code == 200 else None

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            body = self._post(n, "pull", {"batch": 20, "expires": 1})
            if body is None:
                time.sleep(0.2)
                continue
            jobs = body["Result"]
            for job in jobs:
                self.seen[job["Message"]["MessageID"]] += 1
            items = [{"ID": j["ID"], "NextState": "DELIVERED", "Receipt": j["Receipt"]} for j in jobs]
            while items and self._post(n, "ack", {"Jobs": items}) is None and not self.stop.is_set():
                n += 1
                time.sleep(0.3)


# --- the test ------------------------------------------------------------------------------------

def _terminate_broker_backends(cluster: Cluster) -> int:
    rows = cluster.sql(cluster.p_port, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                        "WHERE datname = 'broker' AND pid <> pg_backend_pid() "
                                        "AND backend_type = 'client backend'")
    return rows[0][0]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _recovered(pubs: Publishers, after: float) -> float:
    """Seconds from ``after`` until the first 201 answered after it."""
    times = [t for t, o in list(pubs.answers) if o == "201" and t >= after]
    return (min(times) - after) if times else float("inf")


@pytest.mark.skipif(not (PG_BIN / "initdb").exists(), reason="needs PostgreSQL 15 binaries (BROKER_HA_PG_BIN)")
def test_failover_cut_connections_and_a_silent_network(tmp_path):
    cluster = Cluster()
    procs, report = [], []
    pubs = pullers = ledger = proxy = None
    try:
        cluster.start()
        proxy = Proxy(cluster.p_port)
        url = (f"postgres://{USER}@127.0.0.1:{proxy.port},127.0.0.1:{cluster.s_port}/broker"
               "?target_session_attrs=read-write&connect_timeout=2")
        env = {**CHILD_ENV, "DATABASE_URL": url}
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=child_env(**env),
                                 capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-3000:]
        webs = []
        for _ in range(2):  # each one into procs at once: a failed start still stops the one before
            webs.append(start_web(tmp_path, workers=1, threads=8, **env))
            procs.append(webs[-1])
        procs.append(start_qcluster(tmp_path, **env))
        urls = [w.url for w in webs]
        ledger = Ledger()
        threading.Thread(target=ledger.serve_forever, daemon=True).start()
        s = requests.Session()
        s.headers.update(ADMIN)
        assert s.put(f"{urls[0]}/channel/{CH}", data={"token": CH_TOKEN}).status_code == 200
        assert s.put(f"{urls[0]}/producer/ha-p", data={"token": P_TOKEN}).status_code == 200
        assert s.put(f"{urls[0]}/channel/{CH}/consumer/pusher", data={
            "token": "ha-push", "callbackUrl": f"http://127.0.0.1:{ledger.server_address[1]}/cb", "maxInFlight": "20",
            "connectionTimeout": "5", "maxRetry": "100", "retryBackoff": "0.5"}).status_code == 200
        assert s.put(f"{urls[0]}/channel/{CH}/consumer/puller", data={
            "token": PULL_TOKEN, "type": "pull", "connectionTimeout": "5", "maxRetry": "100"}).status_code == 200
        pulled: Counter = Counter()
        pull_answers: list = []
        pubs = Publishers(urls)
        pullers = [Puller(urls, pulled, pull_answers) for _ in range(2)]
        for t in [*pubs.threads, *pullers]:
            t.start()
        assert wait_for(lambda: len(ledger.seen) > 20 and len(pulled) > 20, 60), "no delivery before the faults"

        def scenario(name: str, fault) -> None:
            began = time.monotonic()
            fault_start, fault_end = fault()
            assert wait_for(lambda: _recovered(pubs, fault_end) < float("inf"), 30, 0.1)
            time.sleep(2)
            during = {"publish": dict(Counter(o for t, o in list(pubs.answers) if fault_start <= t <= fault_end)),
                      "pull": dict(Counter(o for t, o in list(pull_answers) if fault_start <= t <= fault_end))}
            report.append({"scenario": name, "began": began, "fault": (fault_start, fault_end),
                           "recovered": _recovered(pubs, fault_end), "during": during})

        def terminate():
            start = time.monotonic()
            while time.monotonic() - start < 15:
                _terminate_broker_backends(cluster)
                time.sleep(2)
            return start, time.monotonic()

        def slow_then_silent():
            start = time.monotonic()
            proxy.latency = 0.05  # each way: 100 ms more per round trip
            time.sleep(6)
            proxy.dropping.set()
            time.sleep(20)
            proxy.dropping.clear()
            proxy.latency = 0.0
            return start, time.monotonic()

        def failover():
            start = time.monotonic()
            cluster.kill_primary()
            assert wait_for(lambda: not _port_open(cluster.p_port), 5, 0.05), "the primary is still up"
            time.sleep(1)
            cluster.promote()
            assert cluster.sql(cluster.s_port, "SELECT pg_is_in_recovery()") == [(False,)]
            return start, time.monotonic()

        scenario("a: pg_terminate_backend every 2 s for 15 s", terminate)
        scenario("c: +100 ms latency 6 s, then 20 s silent drop", slow_then_silent)
        scenario("b: SIGKILL primary, promote standby", failover)
        pubs.stop.set()
        for t in pubs.threads:
            t.join(35)
        acked = dict(pubs.acked)
        wait_for(lambda: not (set(acked) - set(ledger.seen)) and not (set(acked) - set(pulled)), 60, 0.5)
        for p in pullers:
            p.stop.set()
        alive = {p.pid: p.popen.poll() is None for p in procs}
        outputs = {p.pid: p.output() for p in procs}
    finally:
        if pubs is not None:
            pubs.stop.set()
        for p in pullers or []:
            p.stop.set()
        for p in procs:
            p.stop(grace=3)
        if ledger is not None:
            ledger.shutdown()
            ledger.server_close()
        if proxy is not None:
            proxy.close()
        cluster.stop()

    bounds = [r["began"] for r in report] + [float("inf")]
    lines = []
    for i, r in enumerate(report):
        ids = {m for m, t in acked.items() if bounds[i] <= t < bounds[i + 1]}
        r["acknowledged"] = len(ids)
        r["lost_push"] = len(ids - set(ledger.seen))
        r["lost_pull"] = len(ids - set(pulled))
        lines.append(f"{r['scenario']}: acknowledged {r['acknowledged']}, lost push {r['lost_push']} / pull "
                     f"{r['lost_pull']}, publishing back {r['recovered']:.1f} s after the fault ended "
                     f"(fault {r['fault'][1] - r['fault'][0]:.1f} s), answers during the fault {r['during']}")
    print("\nfailover report:\n  " + "\n  ".join(lines))
    logs = "\n".join(f"--- {pid}\n{out[-2000:]}" for pid, out in outputs.items())
    for r in report:
        assert r["lost_push"] == 0 and r["lost_pull"] == 0, (r, logs)
        assert "500" not in r["during"]["publish"] and "500" not in r["during"]["pull"], (r, logs)
        assert r["recovered"] <= RECOVERY_MAX, (r, logs)
    assert all(alive.values()), f"a broker process ended: {alive}\n{logs}"
    assert not any("reincarnated" in out for out in outputs.values()), logs
    every = Counter(o for _, o in list(pubs.answers) + pull_answers)
    assert "500" not in every, every
