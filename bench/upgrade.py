"""Rolling upgrade under traffic: from the previous release (a commit of this repository) to this tree.

    .venv/bin/python bench/upgrade.py --jobs 1000000     # the figures of docs/upgrades.md
    .venv/bin/python bench/upgrade.py --smoke            # CI (tests/system/bench): tiny sizes, same steps
    .venv/bin/python bench/upgrade.py --jobs 100000 --json out.json   # tests/system/upgrade asserts on it

What it does (docs/upgrades.md, "A rolling deploy"):

1. ``git worktree add`` of ``--previous`` (default ``PREVIOUS_RELEASE``) into a temp dir, run on a
   virtualenv of its own built from that commit's pyproject.toml (pip, from the package index;
   kept under ``~/.cache/broker-bench`` by the hash of its dependency list, so built once); the
   project's own code is imported from the worktree, never installed;
2. a new database (created beside ``DATABASE_URL``'s, or on a throw-away embedded PostgreSQL)
   migrated by the previous release, and a backlog of ``--jobs`` QUEUED jobs written with
   set-based SQL for a pull consumer nobody pulls (big tables, little traffic);
3. the previous release serving: one web process and one qcluster; steady traffic from this
   process: publishes (``--rate`` a second), a push consumer delivering to a loopback receiver, a
   pull consumer pulling and acknowledging with receipts;
4. the upgrade in place: ``migrate`` (this tree), then a migration over the big tables (a nullable
   column on jobs_job and broker_message, an index built CONCURRENTLY on jobs_job:
   ``SAMPLE_MIGRATION``), a new web process beside the old one, the old one taken out of the
   clients' pool and stopped (SIGTERM: gunicorn finishes what it serves), a new qcluster beside the
   old one (its workers stand by on the old one's dispatcher slots), the old qcluster stopped as
   systemd's default ``KillMode=control-group`` does (SIGTERM to its whole process group, SIGKILL
   after ``--grace`` s): the new cluster must hold every slot within 2 s of the old one's last
   process going;
5. then a second new qcluster, and the first one stopped with SIGTERM to its main process only (as
   ``KillMode=mixed`` and Kubernetes do): it must hand its slots over within 2 s and exit within its
   grace period;
6. traffic stops; everything is drained and checked; the last cluster is stopped with SIGTERM to
   its whole process group (noted, not judged: django-q2's main process hangs on it, #346).

Figures: answers by status (publish, pull, ack), the longest stall of any request, the longest
pause of push deliveries at each switch of workers, when the next cluster held every slot, how
each old cluster stopped, what was lost
(a publish answered 201 whose message never reached the push receiver, or was never pulled and
acknowledged) and anything delivered outside at-least-once (a message nobody published, a job not
DELIVERED at the end). Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (ADMIN, base_env, broker_database, free_port, http_ready, smoke_args_parse,  # noqa: E402
                          smoke_problems_exit, wait_for)

# The previous release: the last commit of main before this tree's schema changes. Move it forward
# with each change of the schema (docs/upgrades.md); it must be in the repository's history.
PREVIOUS_RELEASE = "b66868b135851de1aee3db04d1f4101f955afb95"
# The CI test runs this very script (with 100k jobs): no smoke run of its own (tests/system/bench).
SMOKE_COVERED_BY = "tests/system/upgrade/test_rolling.py"
SMOKE_TABLE = r"^upgrade .*: migrate [\d.]+ s, longest stall [\d.]+ s, push pause [\d.]+ s / [\d.]+ s, lost \d+$"
SLOTS = 2  # dispatcher loops per cluster (BROKER_Q_WORKERS = 3)
PROCESS_ENV = {  # the default delivery deadlines (30 s): a killed cluster's claims must come back by
    # the owner check (jobs.sweeps.orphans), not by their deadline
    "BROKER_Q_WORKERS": "3",
    "BROKER_WEB_WORKERS": "1", "BROKER_WEB_THREADS": "16", "BROKER_GUNICORN_CONTROL_SOCKET": "off",
    "BROKER_LOG_LEVEL": "INFO", "BROKER_LOG_FORMAT": "plain",
}
CHANNEL, PRODUCER, PUSH, PULL = "traffic", "traffic-producer", "pushed", "pulled"
BACKLOG_CHANNEL, BACKLOG = "backlog", "backlog-consumer"


# --- the previous release: a worktree and a virtualenv ---------------------------------------------
VENV_CACHE = Path(os.environ.get("BROKER_BENCH_CACHE") or Path.home() / ".cache" / "broker-bench")


def release_requirements(tree: Path) -> list[str]:
    """What the release at ``tree`` depends on: its own pyproject.toml's ``[project] dependencies``."""
    return list(tomllib.loads((tree / "pyproject.toml").read_text())["project"]["dependencies"])


def release_venv(tree: Path) -> Path:
    """A virtualenv with the release's own dependencies (its pyproject.toml, installed by pip from the
    package index), kept under ``VENV_CACHE`` by the hash of that list: built once, reused by later
    runs. The project's own code is not installed: it is imported from the worktree (the working
    directory of every process), so the venv serves any commit with the same dependencies."""
    requirements = release_requirements(tree)
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:16]
    venv = VENV_CACHE / f"release-{key}"
    python = venv / "bin" / "python"
    if (venv / "complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                   check=True)
    (venv / "complete").write_text("\n".join(requirements) + "\n")
    return python


@contextmanager
def release_checkout(commit: str, base: Path):
    """``commit`` checked out with ``git worktree`` under ``base``, and the ``python`` of a virtualenv
    built from that commit's pyproject.toml (``release_venv``): the previous release runs on the
    packages it asked for, not on this tree's."""
    tree = base / "release"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), commit],
                   check=True, capture_output=True, text=True)
    try:
        yield tree, release_venv(tree)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


@contextmanager
def scratch_database(url: str):
    """A new database on ``url``'s server, dropped afterwards (``url``'s own database is untouched)."""
    parts = urlsplit(url)
    name = f"broker_upgrade_{os.getpid()}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path="/" + name))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- processes --------------------------------------------------------------------------------------
class Proc:
    def __init__(self, name: str, args: list, cwd: Path, env: dict, logs: Path, url: str | None = None):
        self.name, self.url, self.log = name, url, logs / f"{name}.log"
        self.popen = subprocess.Popen(args, cwd=cwd, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        self.popen.poll()
        return True if self.popen.returncode is None else _group_has_live(self.popen.pid)

    def stop(self, *, grace: float, group: bool = True) -> dict:
        """SIGTERM (the process group, or its main process only), SIGKILL whatever is left after
        ``grace``; how long the group took to go and whether SIGKILL was needed."""
        started = time.monotonic()
        try:
            (os.killpg if group else os.kill)(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        while time.monotonic() - started < grace and self.group_alive():
            time.sleep(0.05)
        killed = self.group_alive()
        if killed:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self.group_alive():
                time.sleep(0.01)
        self.gone_at = time.monotonic()  # the group's last process went
        self.popen.wait(timeout=10)
        return {"seconds": round(self.gone_at - started, 2), "sigkill": killed, "group": group}


def _group_has_live(pgid: int) -> bool:
    """Whether a process of group ``pgid`` other than zombies is still running (via /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def web_start(name: str, python: Path, tree: Path, env: dict, logs: Path) -> Proc:
    port = free_port()
    proc = Proc(name, [str(python), "-m", "gunicorn", "broker.wsgi:application"], tree,
                {**env, "BROKER_BIND": f"127.0.0.1:{port}"}, logs, url=f"http://127.0.0.1:{port}")
    http_ready(proc.popen, proc.url, proc.log.read_text, name=name)
    return proc


def qcluster_start(name: str, python: Path, tree: Path, env: dict, logs: Path) -> Proc:
    return Proc(name, [str(python), "manage.py", "qcluster"], tree, env, logs)


def slot_sessions(url: str) -> Counter:
    """The dispatcher slot connections by application_name (loops and, from this release, standbys)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return Counter(dict(conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE application_name IN ('broker-push-slot', 'broker-push-standby') GROUP BY 1").fetchall()))


# --- a migration over the big tables ------------------------------------------------------------------
# Run with this tree's code right after its own ``migrate``, through the same executor and schema
# editor (django-pg-zero-downtime-migrations, broker.schema_editor): a nullable column added to
# jobs_job and broker_message and an index built CONCURRENTLY on jobs_job, while the previous
# release serves (it never reads the column: expand). Recorded as jobs.9000_upgrade_sample in the
# scratch database only.
SAMPLE_MIGRATION = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
import django
django.setup()
from django.db import connection, models
from django.db.migrations import AddField, AddIndex, Migration
from django.db.migrations.executor import MigrationExecutor
executor = MigrationExecutor(connection)
leaf = executor.loader.graph.leaf_nodes("jobs")[0]
migration = Migration("9000_upgrade_sample", "jobs")
migration.atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction
migration.dependencies = [leaf]
migration.operations = [
    AddField("job", "upgrade_sample", models.BigIntegerField(null=True)),
    AddIndex("job", models.Index(fields=["consumer", "upgrade_sample"], name="job_upgrade_sample")),
]
executor.apply_migration(executor.loader.project_state(leaf, at_end=True), migration)
broker_leaf = executor.loader.graph.leaf_nodes("broker")[0]
message = Migration("9000_upgrade_sample", "broker")
message.dependencies = [broker_leaf]
message.operations = [AddField("message", "upgrade_sample", models.BigIntegerField(null=True))]
executor.apply_migration(executor.loader.project_state(broker_leaf, at_end=True), message)
"""


def sample_migration_check(url: str) -> dict:
    """What the sample migration left: the columns, and the index valid (a failed concurrent build
    leaves it INVALID)."""
    with psycopg.connect(url, autocommit=True) as conn:
        columns = conn.execute("SELECT table_name FROM information_schema.columns WHERE column_name = 'upgrade_sample'"
                               " ORDER BY 1").fetchall()
        valid = conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                             " WHERE c.relname = 'job_upgrade_sample'").fetchone()
        rows = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'jobs_job'").fetchone()[0]
    return {"columns": [t for (t,) in columns], "index_valid": bool(valid and valid[0]), "jobs_rows": rows}


class SlotWatch:
    """When a cluster standing by took every dispatcher slot: from its start, pg_stat_activity is
    read every 20 ms until no ``broker-push-standby`` session is left and ``SLOTS`` loops hold their
    slots (each standby renames its session when the server grants it the slot)."""

    def __init__(self, url: str) -> None:
        self.url, self.taken_at = url, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            sessions = slot_sessions(self.url)
            if not sessions["broker-push-standby"] and sessions["broker-push-slot"] >= SLOTS:
                self.taken_at = time.monotonic()
                return
            time.sleep(0.02)

    def after(self, moment: float) -> float | None:
        """Seconds from ``moment`` until the slots were taken (0 when before it; None: never)."""
        self.thread.join(timeout=130)
        return None if self.taken_at is None else round(max(0.0, self.taken_at - moment), 3)


# --- the database at the previous release -------------------------------------------------------------
def registry_put(url: str) -> None:
    """The traffic's and the backlog's channels, producer and consumers, through the API (PUT)."""
    session = requests.Session()
    session.headers["X-Broker-Admin-Token"] = ADMIN

    def put(path: str, **data) -> None:
        r = session.put(url + path, data=data, timeout=30)
        r.raise_for_status()

    put(f"/producer/{PRODUCER}", token="pt")
    for channel in (CHANNEL, BACKLOG_CHANNEL):
        put(f"/channel/{channel}", token="ct")
    put(f"/channel/{CHANNEL}/consumer/{PUSH}", token="kt", callbackUrl=RECEIVER.url, maxInFlight="50")
    put(f"/channel/{CHANNEL}/consumer/{PULL}", token="kt", type="pull")
    put(f"/channel/{BACKLOG_CHANNEL}/consumer/{BACKLOG}", token="kt", type="pull")


BACKLOG_SQL = """
WITH ids AS (SELECT (SELECT id FROM broker_channel WHERE channel_id = %(channel)s) AS channel,
                    (SELECT id FROM broker_producer WHERE producer_id = %(producer)s) AS producer,
                    (SELECT k.id FROM consumers_consumer k JOIN broker_channel c ON c.id = k.channel_id
                      WHERE c.channel_id = %(channel)s AND k.consumer_id = %(consumer)s) AS consumer),
m AS (INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                                  status, received_at, dispatched_at)
      SELECT ids.channel, 'backlog-' || g, ids.producer, convert_to('{"backlog": ' || g || '}', 'UTF8'),
             'application/json', 0, '{}'::jsonb, 102, now(), now()
        FROM ids, generate_series(%(lo)s::bigint, %(hi)s::bigint) g
      RETURNING id, channel_id)
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      incremental_timeout, status_changed_at, created_at, gate)
SELECT m.id, ids.consumer, m.channel_id, 1001, 0, 0, now(), 0, now(), now(), 0 FROM m, ids
"""


def backlog_fill(url: str, jobs: int, batch: int = 250_000) -> float:
    """``jobs`` QUEUED jobs (and their messages), set-based, in batches; then ANALYZE. Seconds taken."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(1, jobs + 1, batch):
            conn.execute(BACKLOG_SQL, {"channel": BACKLOG_CHANNEL, "producer": PRODUCER, "consumer": BACKLOG,
                                       "lo": lo, "hi": min(jobs, lo + batch - 1)})
        conn.execute("ANALYZE")
    return time.monotonic() - started


# --- traffic ---------------------------------------------------------------------------------------
class PushReceiver:
    """A loopback HTTP receiver answering 204 and noting (time, message id) of every callback."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.seen.append((time.monotonic(), self.headers.get("X-Broker-Message-ID", "")))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self) -> set[str]:
        with self.lock:
            return {mid for _, mid in self.seen}

    def gaps(self, start: float, end: float) -> float:
        """The longest time without a callback within [start, end]."""
        with self.lock:
            times = sorted(t for t, _ in self.seen if start <= t <= end)
        points = [start, *times, min(end, time.monotonic())]
        return max(b - a for a, b in zip(points, points[1:]))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


RECEIVER: PushReceiver  # set by main (registry_put names its URL)


class Traffic:
    """Publishers and a pull consumer over the web processes in ``pool`` (a load balancer's list,
    replaced as processes come and go); every answer's status and latency is noted."""

    def __init__(self, *, rate: float, publishers: int = 2) -> None:
        self.pool: list[str] = []
        self.rate = rate
        self.publishers = publishers
        self.running = threading.Event()
        self.publishing = threading.Event()
        self.lock = threading.Lock()
        self.answers: Counter = Counter()  # (kind, status) -> n
        self.bad: list[str] = []  # 5xx without Retry-After, other 5xx, no answer
        self.stall = (0.0, "")  # longest request: (seconds, what)
        self.published: set[str] = set()  # answered 201
        self.attempted: set[str] = set()  # every message id sent (an answer may be lost)
        self.acked: set[str] = set()  # message ids whose ack was accepted
        self.pulled = Counter()  # message id -> times pulled
        self.threads: list[threading.Thread] = []
        self.n = 0

    def _note(self, kind: str, started: float, response, error: str = "") -> None:
        seconds = time.monotonic() - started
        with self.lock:
            if seconds > self.stall[0]:
                self.stall = (seconds, kind)
            if response is None:
                self.answers[(kind, "no answer")] += 1
                self.bad.append(f"{kind}: no answer ({error})")
                return
            self.answers[(kind, response.status_code)] += 1
            if response.status_code >= 500 and not (response.status_code == 503 and response.headers.get("Retry-After")):
                self.bad.append(f"{kind}: {response.status_code} {response.text[:200]}")

    def _url(self, i: int) -> str:
        pool = self.pool
        return pool[i % len(pool)]

    def _publisher(self, k: int) -> None:
        session = requests.Session()
        period = self.publishers / self.rate
        i = 0
        next_at = time.monotonic()
        while self.publishing.is_set():
            i += 1
            mid = f"m-{k}-{i}"
            with self.lock:
                self.attempted.add(mid)
            started = time.monotonic()
            response, error = None, ""
            try:
                response = session.post(f"{self._url(i)}/channel/{CHANNEL}/broadcast", data=json.dumps({"n": i}),
                                        timeout=10, headers={
                                            "X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": PRODUCER,
                                            "X-Broker-Producer-Token": "pt", "X-Broker-Message-ID": mid,
                                            "Content-Type": "application/json"})
            except requests.RequestException as exc:
                error = type(exc).__name__
            self._note("publish", started, response, error)
            if response is not None and response.status_code == 201:
                with self.lock:
                    self.published.add(mid)
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _puller(self) -> None:
        session = requests.Session()
        headers = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
        base = f"/channel/{CHANNEL}/consumer/{PULL}"
        i = 0
        while self.running.is_set():
            i += 1
            started = time.monotonic()
            response, error = None, ""
            try:
                response = session.post(f"{self._url(i)}{base}/pull", json={"batch": 100, "no_wait": True},
                                        headers=headers, timeout=10)
            except requests.RequestException as exc:
                error = type(exc).__name__
            self._note("pull", started, response, error)
            jobs = response.json().get("Result", []) if response is not None and response.status_code == 200 else []
            if not jobs:
                time.sleep(0.05)
                continue
            by_id = {j["ID"]: j["Message"]["MessageID"] for j in jobs}
            with self.lock:
                self.pulled.update(by_id.values())
            started = time.monotonic()
            response, error = None, ""
            try:
                response = session.post(f"{self._url(i)}{base}/ack", headers=headers, timeout=10, json={"Jobs": [
                    {"ID": j["ID"], "NextState": "DELIVERED", "Receipt": j["Receipt"]} for j in jobs]})
            except requests.RequestException as exc:
                error = type(exc).__name__
            self._note("ack", started, response, error)
            if response is not None and response.status_code == 200:
                ok = {item["ID"] for item in response.json().get("Result", []) if not item.get("Error")}
                with self.lock:
                    self.acked.update(by_id[j] for j in ok if j in by_id)

    def start(self) -> None:
        self.running.set()
        self.publishing.set()
        self.threads = [threading.Thread(target=self._publisher, args=(k,), daemon=True) for k in range(self.publishers)]
        self.threads.append(threading.Thread(target=self._puller, daemon=True))
        for thread in self.threads:
            thread.start()

    def stop_publishing(self) -> None:
        self.publishing.clear()
        for thread in self.threads[:-1]:
            thread.join(timeout=30)

    def stop(self) -> None:
        self.stop_publishing()
        self.running.clear()
        for thread in self.threads:
            thread.join(timeout=30)


def final_states(url: str) -> dict:
    """Job counts by consumer and status name at the end."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT k.consumer_id, j.status, count(*) FROM jobs_job j JOIN consumers_consumer k ON k.id = j.consumer_id"
            " WHERE k.consumer_id IN (%s, %s) GROUP BY 1, 2", [PUSH, PULL]).fetchall()
    names = {1001: "QUEUED", 1002: "INFLIGHT", 1003: "DELIVERED", 1004: "DEAD"}
    states: dict = {}
    for consumer, status, n in rows:
        states.setdefault(consumer, {})[names.get(status, str(status))] = n
    return states


# --- the run -----------------------------------------------------------------------------------------
def run(args, base: Path, database_url: str) -> dict:
    global RECEIVER
    logs = base / "logs"
    logs.mkdir()
    figures: dict = {"previous": args.previous, "jobs": args.jobs, "rate": args.rate}
    with ExitStack() as stack:
        tree, old_python = stack.enter_context(release_checkout(args.previous, base))
        url = stack.enter_context(scratch_database(database_url))
        env = base_env(url, **PROCESS_ENV, BROKER_DATA_DIR=str(base / "data"))
        RECEIVER = PushReceiver()
        stack.callback(RECEIVER.close)
        procs: list[Proc] = []
        stack.callback(lambda: [p.stop(grace=2) for p in procs if p.popen.poll() is None or p.group_alive()])

        subprocess.run([str(old_python), "manage.py", "migrate", "-v0"], cwd=tree, env=env, check=True)
        old_web = web_start("old-web", old_python, tree, env, logs)
        procs.append(old_web)
        registry_put(old_web.url)
        figures["backlog_seconds"] = round(backlog_fill(url, args.jobs), 1)
        old_q = qcluster_start("old-qcluster", old_python, tree, env, logs)
        procs.append(old_q)
        wait_for(lambda: slot_sessions(url)["broker-push-slot"] >= SLOTS, 60, "the old cluster's dispatcher loops")

        traffic = Traffic(rate=args.rate)
        traffic.pool = [old_web.url]
        traffic.start()
        time.sleep(args.seconds)
        marks = {}

        started = time.monotonic()  # 1. migrate, with the old release serving
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        figures["migrate_seconds"] = round(time.monotonic() - started, 2)
        started = time.monotonic()  # and a migration over the big tables (a column, an index CONCURRENTLY)
        subprocess.run([sys.executable, "-c", SAMPLE_MIGRATION], cwd=ROOT, env=env, check=True)
        figures["big_table_migration_seconds"] = round(time.monotonic() - started, 2)
        figures["big_table_migration"] = sample_migration_check(url)
        new_web = web_start("new-web", Path(sys.executable), ROOT, env, logs)  # 2. new web beside the old
        procs.append(new_web)
        traffic.pool = [old_web.url, new_web.url]
        time.sleep(args.seconds / 2)
        traffic.pool = [new_web.url]  # 3. the old web out of the pool, then stopped
        time.sleep(0.5)
        figures["old_web_stop"] = old_web.stop(grace=args.grace)
        new_q = qcluster_start("new-qcluster", Path(sys.executable), ROOT, env, logs)  # 4. workers swapped
        procs.append(new_q)
        wait_for(lambda: slot_sessions(url)["broker-push-standby"] >= SLOTS, 60, "the new cluster's standbys")
        time.sleep(args.seconds / 2)
        marks["old_q"] = time.monotonic()
        # as systemd's default KillMode=control-group: SIGTERM to the whole group, SIGKILL after the grace
        watch = SlotWatch(url)
        figures["old_qcluster_stop"] = old_q.stop(grace=args.grace, group=True)
        figures["slots_taken_old_to_new"] = watch.after(old_q.gone_at)  # after its last process went
        time.sleep(args.seconds)
        figures["push_pause_old_to_new"] = round(RECEIVER.gaps(marks["old_q"], time.monotonic()), 3)
        figures["push_pause_after_old_gone"] = round(RECEIVER.gaps(old_q.gone_at, time.monotonic()), 3)

        next_q = qcluster_start("next-qcluster", Path(sys.executable), ROOT, env, logs)  # 5. new to new
        procs.append(next_q)
        wait_for(lambda: slot_sessions(url)["broker-push-standby"] >= SLOTS, 60, "the next cluster's standbys")
        marks["new_q"] = time.monotonic()
        # as systemd's KillMode=mixed and Kubernetes: SIGTERM to the main process only
        watch = SlotWatch(url)
        figures["new_qcluster_stop"] = new_q.stop(grace=args.grace, group=False)
        figures["slots_taken_new_to_new"] = watch.after(marks["new_q"])  # after the SIGTERM (stricter)
        time.sleep(args.seconds)
        figures["push_pause_new_to_new"] = round(RECEIVER.gaps(marks["new_q"], time.monotonic()), 3)

        traffic.stop_publishing()  # 6. drain and check
        published = set(traffic.published)
        try:
            wait_for(lambda: published <= RECEIVER.ids() and published <= traffic.acked, args.drain,
                     "every published message pushed and acknowledged")
        except RuntimeError:
            pass  # counted as lost below
        traffic.stop()
        figures["stall_seconds"] = round(traffic.stall[0], 3)
        figures["stall_request"] = traffic.stall[1]
        figures["answers"] = {f"{kind} {status}": n for (kind, status), n in sorted(traffic.answers.items(), key=str)}
        figures["bad_answers"] = traffic.bad[:20]
        figures["published"] = len(published)
        figures["lost_push"] = sorted(published - RECEIVER.ids())[:20]
        figures["lost_pull"] = sorted(published - traffic.acked)[:20]
        figures["lost"] = len((published - RECEIVER.ids()) | (published - traffic.acked))
        figures["phantom"] = sorted((RECEIVER.ids() | set(traffic.pulled)) - traffic.attempted)[:20]
        pushes = Counter(mid for _, mid in RECEIVER.seen)
        figures["push_duplicates"] = sum(n - 1 for n in pushes.values())
        figures["pull_duplicates"] = sum(n - 1 for n in traffic.pulled.values())
        # the receiver counts a callback when it arrives, the job is DELIVERED once its answer is back
        # at the dispatcher and committed: a job may be INFLIGHT a moment after its id was seen
        try:
            wait_for(lambda: all(set(states) <= {"DELIVERED"} for states in final_states(url).values()), 30,
                     "every job of both consumers DELIVERED", interval=0.5)
        except RuntimeError:
            pass  # reported by problems_of below
        figures["final_states"] = final_states(url)
        # the last cluster, its whole process group signalled (systemd's default KillMode): the loops
        # hand over at once, but the main process hangs until SIGKILL (django-q2 #346, docs/upgrades.md)
        figures["next_qcluster_stop"] = next_q.stop(grace=args.grace, group=True)
        if args.logs:
            shutil.copytree(logs, args.logs, dirs_exist_ok=True)
    return figures


def problems_of(figures: dict, *, limit: float = 2.0) -> list[str]:
    """What the rolling upgrade must not do (tests/system/upgrade asserts the same list is empty)."""
    problems = []
    if figures["bad_answers"]:
        problems.append(f"answers other than 2xx/4xx/503 with Retry-After: {figures['bad_answers']}")
    if figures["stall_seconds"] >= limit:
        problems.append(f"a request stalled {figures['stall_seconds']} s ({figures['stall_request']})")
    for key in ("push_pause_old_to_new", "push_pause_after_old_gone", "push_pause_new_to_new"):
        if figures[key] > limit:
            problems.append(f"{key}: push deliveries paused {figures[key]} s")
    for key in ("slots_taken_old_to_new", "slots_taken_new_to_new"):
        if figures[key] is None or figures[key] > limit:
            problems.append(f"{key}: the next cluster held every slot only {figures[key]} s after the stop")
    sample = figures["big_table_migration"]
    if sample["columns"] != ["broker_message", "jobs_job"] or not sample["index_valid"]:
        problems.append(f"the migration over the big tables did not apply: {sample}")
    if figures["new_qcluster_stop"]["sigkill"]:
        problems.append(f"the new cluster did not exit within its grace period: {figures['new_qcluster_stop']}")
    if figures["lost"]:
        problems.append(f"{figures['lost']} acknowledged publishes lost: push {figures['lost_push']}, "
                        f"pull {figures['lost_pull']}")
    if figures["phantom"]:
        problems.append(f"delivered but never published: {figures['phantom']}")
    for consumer, states in figures["final_states"].items():
        if set(states) - {"DELIVERED"}:
            problems.append(f"{consumer} jobs not all DELIVERED at the end: {states}")
    if not figures["published"]:
        problems.append("nothing was published")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--previous", default=PREVIOUS_RELEASE, help="the release upgraded from (a commit)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="backlog of QUEUED jobs written before")
    parser.add_argument("--rate", type=float, default=100.0, help="publishes a second")
    parser.add_argument("--seconds", type=float, default=4.0, help="traffic between the steps")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds a stopped process gets before SIGKILL")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds allowed for the final drain")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--logs", help="copy the processes' logs to this folder")
    args = smoke_args_parse(parser, jobs=1000, rate=20.0, seconds=1.5, grace=3.0)
    base = Path(tempfile.mkdtemp(prefix="broker-upgrade-"))
    try:
        with broker_database() as database_url:
            figures = run(args, base, database_url)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    answers = ", ".join(f"{k}: {v}" for k, v in figures["answers"].items())
    print(f"upgrade {figures['previous'][:7]} -> this tree, backlog {figures['jobs']:,} jobs, "
          f"{figures['rate']:g} publishes/s")
    print(f"  answers: {answers}")
    print(f"  migrate {figures['migrate_seconds']} s, then a column on jobs_job and broker_message and an index "
          f"built concurrently on jobs_job ({figures['big_table_migration']['jobs_rows']:,} rows): "
          f"{figures['big_table_migration_seconds']} s")
    print(f"  old qcluster stop (SIGTERM to its group, SIGKILL after {args.grace:g} s): {figures['old_qcluster_stop']}, "
          f"slots held by the new cluster {figures['slots_taken_old_to_new']} s after its last process went, push "
          f"pause after that {figures['push_pause_after_old_gone']} s")
    print(f"  new qcluster stop (SIGTERM to its main process): {figures['new_qcluster_stop']}, slots held by the "
          f"next cluster after {figures['slots_taken_new_to_new']} s; last qcluster stop (SIGTERM to its group): "
          f"{figures['next_qcluster_stop']}")
    print(f"  duplicates (at-least-once): push {figures['push_duplicates']}, pull {figures['pull_duplicates']}; "
          f"final states {figures['final_states']}")
    print(f"upgrade {figures['published']:,} published: migrate {figures['migrate_seconds']} s, longest stall "
          f"{figures['stall_seconds']} s, push pause {figures['push_pause_old_to_new']} s / "
          f"{figures['push_pause_new_to_new']} s, lost {figures['lost']}")
    smoke_problems_exit(problems=problems_of(figures))


if __name__ == "__main__":
    main()
