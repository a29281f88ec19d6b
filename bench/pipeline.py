"""Benchmark of the Spark pipeline: a report over 10,000,000 jobs, then an incremental one.

    .venv/bin/python bench/pipeline.py [--jobs 10000000] [--new-jobs 100000] [--days 60]
                                       [--master spark://host:7077] [--equality] [--rebuild-check] [--keep] [--smoke]

Uses a database of its own (``broker_bench_pipeline``) on the embedded PostgreSQL under
``BROKER_DATA_DIR/postgres`` (``.data``; or on the server of ``DATABASE_URL``; with ``--smoke`` and
no DATABASE_URL a throw-away server), creates the channels, producer and consumers through the
broker's services and fills messages, jobs and their history server-side, in batches of 500,000
messages, with ``INSERT ... SELECT generate_series`` (4 consumers on 2 channels, one message per 2
jobs, spread over the ``--days`` (60) before now; ~90% delivered, 4% dead, 6% pending; 0-3 attempts and
0-6 transitions per job). Then, each report a ``manage.py pipeline report`` of its own, timed from
the command's start (Python, Django and Spark start-up included), with its facts in the bench's
BROKER_PIPELINE_DIR:

1. the first report over every job: every day read over JDBC, the finished days' facts written;
2. ``--new-jobs`` more jobs published in the last minutes, and the second report: the finished
   days from the facts, only today's rows over JDBC;
3. with ``--equality``: ``pipeline archive --older-than 55d --dead-older-than 55d``, the broker's
   retention sweep (``retention_run``, retention and dead retention 50 days, until it removes
   nothing more: the days 50 to 55 days old lose rows that no archive holds; both windows scaled
   with ``--days``), and a third report
   over the second one's window, which must equal it figure for figure, from the facts
   (``--rebuild-check``: and a fourth, ``--rebuild``, every day read again from the archive and the
   database, the days retention took from keeping their facts: equal too).

Prints each run's wall time, the rows read over JDBC, the CPU seconds of the report's process
tree (the Spark JVM) and of PostgreSQL, and what the run cost vacuum: the longest transaction open
on the database meanwhile and the oldest snapshot's age (``SnapshotWatch``: ``pg_stat_activity``
every 100 ms), then drops the database and the output (unless ``--keep``).
``--smoke``: 2,000 jobs over 3 days then 200 (the test suite runs it; ``--smoke --equality
--rebuild-check`` runs the whole check small).
``--master spark://...``: the same on a standalone cluster (whose workers see this machine's disk).
Target: the second report under 60 s with Spark start-up, on the 2-core machine, local Spark.

Recorded 2026-11-26 (2 cores shared with other engineers' test runs, 24 GB, Java 17, pyspark 4.3.0,
local[*], driver 4g, embedded PostgreSQL 18 with fsync on), the command
``BROKER_DATA_DIR=/tmp/pl-bench10m/data bench/pipeline.py --jobs 10000000 --equality --rebuild-check``:

    rows:    5,000,000 messages, 10,000,000 jobs, 22,500,000 transitions, 11,100,000 attempts (filled in 347.7 s)
    first:   10,000,000 jobs in 340.8 s with start-up (report 333.5 s: JDBC jobs and attempts 181.3 s, the
             transitions and the facts of 61 days 128.9 s, aggregates 20.9 s); 43,600,000 rows read over JDBC;
             CPU: report 409 s, PostgreSQL 216 s
    second:  100,000 more jobs: 10,100,000 jobs in 41.9 s with start-up (report 35.0 s: JDBC 13.4 s, aggregates
             20.8 s, of which counts and exact percentiles 13.6 s); 474,009 rows read over JDBC (224,648 jobs,
             249,361 attempts: today's); 61 days from the facts; CPU: report 56 s, PostgreSQL 9 s
    archive: older than 55 days: 368,819 messages, 737,638 jobs, 1,751,856 transitions, 875,928 attempts in
             96.3 s; retention at 50 days: 3,713,487 rows removed in 15.0 s (no archive holds them)
    third:   equal to the second, figure for figure: 54.4 s with start-up, the same 474,009 rows over JDBC
             (PostgreSQL busy vacuuming retention's deletes meanwhile: 21 s of its CPU)
    fourth:  --rebuild, equal to the second too: 345.3 s; 37,323,854 rows over JDBC and 26.4 s reading the
             archive; 55 days rewritten, the 6 days retention took rows from kept their facts

Chunked reads (issue 35, item 2), recorded 2026-11-28: the code before the chunks and after them,
run at the same time on the same 2-core machine (shared, load average 13 to 20 throughout, so every
time is several times the quiet machine's), ``bench/pipeline.py --jobs 1000000 --new-jobs 100000
--days 20`` each:

    before:  first report: longest transaction 71.6 s (oldest snapshot 71.7 s); read 970.9 s
             (JDBC jobs 290.0 s, attempts 334.5 s, transitions 281.0 s); CPU: report 129.2 s, PostgreSQL 34.1 s
             second report: longest transaction 4.6 s; read 38.8 s
    after:   first report: longest transaction 8.4 s (oldest snapshot 8.4 s), in chunks of 20,000 rows; read
             996.3 s (JDBC jobs 283.6 s, attempts 342.3 s, transitions 305.3 s); CPU: report 133.6 s,
             PostgreSQL 28.9 s
             second report: longest transaction 1.4 s; read 33.3 s
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import base_env, broker_database, django_setup, registry_create, smoke_args_parse  # noqa: E402

BENCH_DB = "broker_bench_pipeline"
SMOKE_TABLE = (r"^first report: \d+ jobs in [\d.]+s .*rows read over JDBC.*longest transaction [\d.]+s.*$(?s:.*)"
               r"^second report: \d+ jobs in [\d.]+s .*rows read over JDBC.*longest transaction [\d.]+s.*$")
SMOKE_NEEDS = ("spark",)
CHANNELS = ["bench-ch0", "bench-ch1"]
PRODUCERS = ["bench-producer"]
CONSUMERS = [(ch, f"{ch}-c{k}", "push", "http://127.0.0.1:9/cb") for ch in CHANNELS for k in range(2)]
BATCH = 500_000  # messages per INSERT
FIGURES = ("jobs", "summary", "attempts_histogram", "failures", "throughput", "partitions")


def database_prepare(server_url: str) -> tuple[str, dict]:
    """Create (fresh) the bench database on the server of ``server_url`` and return its URL and
    the admin connection keywords; Django is not set up yet."""
    import dj_database_url
    import psycopg

    cfg = dj_database_url.parse(server_url)
    admin = dict(host=cfg["HOST"], port=cfg["PORT"] or 5432, user=cfg["USER"], password=cfg["PASSWORD"] or None)
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return f"{server_url.rsplit('/', 1)[0]}/{BENCH_DB}", admin


@contextmanager
def database_server(*, smoke: bool):
    """URL of the server to use: DATABASE_URL's, else the embedded one under BROKER_DATA_DIR (a
    throw-away one in smoke mode, so a CI run leaves no server behind)."""
    if os.environ.get("DATABASE_URL") or smoke:
        with broker_database() as url:
            yield url
        return
    from broker.embedded_db import server_ensure

    yield server_ensure(Path(os.environ.get("BROKER_DATA_DIR", ROOT / ".data")) / "postgres").url


def database_drop(admin: dict) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


# One batch: messages g in [lo, hi] of a series of ``total`` spread evenly over ``span`` up to ``end``;
# then the jobs of the new messages (ids above ``after``), their history and attempts (jobs above ``after``).
MESSAGES_SQL = """
INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                            status, received_at, dispatched_at)
SELECT (SELECT array_agg(id ORDER BY id) FROM broker_channel)[1 + g %% 2], %(tag)s || g,
       (SELECT id FROM broker_producer), convert_to('{"n": ' || g || '}', 'UTF8'), 'application/json', g %% 3,
       jsonb_build_object('X-Trace', 't' || g), 102, t.at, t.at
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g
 CROSS JOIN LATERAL (SELECT %(end)s::timestamptz - ((%(total)s - g + 1)::float8 / %(total)s)
                            * %(span)s::interval AS at) t"""
JOBS_SQL = """
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      incremental_timeout, status_changed_at, created_at)
SELECT m.id, c.id, c.channel_id, s.status, m.priority, s.retry, m.received_at, 0,
       LEAST(m.received_at + (((m.id * 31 + c.id * 17) %% 5000) * interval '1 millisecond')
                           + s.retry * interval '30 seconds', %(end)s::timestamptz), m.received_at
  FROM broker_message m JOIN consumers_consumer c ON c.channel_id = m.channel_id
 CROSS JOIN LATERAL (SELECT (m.id * 7 + c.id * 13) %% 100 AS h) x
 CROSS JOIN LATERAL (SELECT CASE WHEN x.h < 90 THEN 1003 WHEN x.h < 94 THEN 1004
                                 WHEN x.h < 97 THEN 1001 ELSE 1002 END AS status,
                            CASE WHEN x.h < 90 THEN (x.h %% 10 = 0)::int WHEN x.h < 94 THEN 3 ELSE 0 END AS retry) s
 WHERE m.id > %(after)s"""
# each try is a claim then a failure (back to QUEUED, or DEAD the last time); then the final claim
# and DELIVERED for delivered jobs, a claim for in-flight ones
TRANSITIONS_SQL = """
INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
SELECT j.id, v.from_s, v.to_s, v.retry, v.reason, j.created_at + v.offs * interval '1 second'
  FROM jobs_job j
 CROSS JOIN LATERAL (
     SELECT 1001 AS from_s, 1002 AS to_s, r AS retry, 'claim' AS reason, r * 30 AS offs
       FROM generate_series(0, j.retry_count - 1) r
     UNION ALL
     SELECT 1002, CASE WHEN j.status = 1004 AND r = j.retry_count - 1 THEN 1004 ELSE 1001 END,
            r + 1, 'failed', r * 30 + 1 FROM generate_series(0, j.retry_count - 1) r
     UNION ALL
     SELECT 1001, 1002, j.retry_count, 'claim', j.retry_count * 30 WHERE j.status IN (1002, 1003)
     UNION ALL
     SELECT 1002, 1003, j.retry_count, 'ack', extract(epoch FROM j.status_changed_at - j.created_at)
      WHERE j.status = 1003
 ) v
 WHERE j.id > %(after)s"""
# one attempt per failed try (500/503/timeout) plus the successful one
ATTEMPTS_SQL = """
INSERT INTO jobs_deliveryattempt (job_id, attempt, started_at, duration_ms, status_code, response_excerpt,
                                  error, request_id, outcome)
SELECT j.id, r + 1, j.created_at + r * interval '30 seconds', 20 + (j.id %% 200),
       CASE WHEN r < j.retry_count THEN (ARRAY[500, 503, NULL])[1 + (j.id + r) %% 3] ELSE 200 END,
       '', CASE WHEN r < j.retry_count AND (j.id + r) %% 3 = 2 THEN 'ReadTimeout: timed out' ELSE '' END,
       '', CASE WHEN r < j.retry_count THEN 'failed' ELSE 'delivered' END
  FROM jobs_job j
 CROSS JOIN LATERAL generate_series(0, j.retry_count - CASE WHEN j.status = 1003 THEN 0 ELSE 1 END) r
 WHERE j.status IN (1003, 1004) AND j.id > %(after)s"""


def messages_fill(*, messages: int, span: timedelta, end: datetime, tag: str) -> None:
    """``messages`` messages (two jobs each) published over ``span`` up to ``end``, in batches."""
    from django.db import connection

    with connection.cursor() as cur:
        for lo in range(1, messages + 1, BATCH):
            hi = min(lo + BATCH - 1, messages)
            cur.execute("SELECT COALESCE(max(id), 0) FROM broker_message")
            after_message = cur.fetchone()[0]
            cur.execute("SELECT COALESCE(max(id), 0) FROM jobs_job")
            after_job = cur.fetchone()[0]
            cur.execute(MESSAGES_SQL, {"lo": lo, "hi": hi, "total": messages, "span": span, "end": end, "tag": tag})
            cur.execute(JOBS_SQL, {"after": after_message, "end": end})
            cur.execute(TRANSITIONS_SQL, {"after": after_job})
            cur.execute(ATTEMPTS_SQL, {"after": after_job})
            print(f"  {tag}: messages {lo}-{hi} of {messages}", flush=True)
        cur.execute("ANALYZE")


def table_counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        counts = {}
        for table in ("broker_message", "jobs_job", "jobs_jobtransition", "jobs_deliveryattempt"):
            cur.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cur.fetchone()[0]
    return counts


def _cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children) from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class TreeCpu:
    """CPU seconds of a process tree, sampled from /proc while it runs (a child that outlives its
    parent, as the Spark JVM does, is still counted: the last sample it had)."""

    def __init__(self, root: int):
        self.root, self.seen, self._stop = root, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.sample()

    def sample(self) -> None:
        tree = {self.root}
        table = {int(p): _cpu(int(p)) for p in os.listdir("/proc") if p.isdigit()}
        grown = True
        while grown:
            grown = False
            for pid, info in table.items():
                if info and pid not in tree and info[0] in tree:
                    tree.add(pid)
                    grown = True
        for pid in tree:
            if table.get(pid):
                self.seen[pid] = max(self.seen.get(pid, 0.0), table[pid][1])

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(sum(self.seen.values()), 1)


class SnapshotWatch:
    """What a run's reads cost vacuum: every ``interval`` seconds (0.1), the transactions open on
    the database (every client session but this watch's): the longest open (``clock_timestamp() -
    xact_start``, seconds) and the oldest snapshot (``age(backend_xmin)``, in transaction ids, and
    in seconds: how long ago the transaction counter stood at that xmin, from the counter sampled
    each time), with the session's application_name (``broker-pipeline``: Spark's JDBC reads).
    With ``tick`` (not on a replica) each sample spends one transaction id, as a live broker's
    writes would, so an xmin's age grows with the time it is held even on an idle database.
    ``applications`` holds every application seen connected, ``transactions`` the distinct
    transactions seen open per application; ``stop()`` returns the maxima."""

    SAMPLE = """SELECT application_name, extract(epoch FROM clock_timestamp() - xact_start)::float8,
                       age(backend_xmin), pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pid, xact_start
                  FROM pg_stat_activity
                 WHERE datname = current_database() AND backend_type = 'client backend'
                   AND pid <> pg_backend_pid()"""
    TICK = "SELECT pg_current_xact_id()"

    def __init__(self, conninfo: dict, *, interval: float = 0.1, tick: bool = True):
        import psycopg

        self.conn = psycopg.connect(**conninfo, application_name="snapshot-watch", autocommit=True)
        self.interval, self.tick = interval, tick
        self.samples = 0
        self.started = time.monotonic()
        self.times: list[float] = []  # when each sample was taken
        self.next_xids: list[int] = []  # the next transaction id then (ascending)
        self.longest_s, self.longest_app = 0.0, ""
        self.oldest_xmin_age, self.oldest_xmin_s, self.xmin_app = 0, 0.0, ""
        self.applications: set[str] = set()
        self.transactions: dict[str, set] = {}
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def conninfo(alias: str = "default") -> dict:
        """psycopg keywords for a Django database (the bench's, or the test database)."""
        from django.db import connections

        sd = connections[alias].settings_dict
        info = {"dbname": sd["NAME"], "host": sd.get("HOST"), "port": sd.get("PORT"), "user": sd.get("USER"),
                "password": sd.get("PASSWORD")}
        return {k: v for k, v in info.items() if v}

    def _since(self, xid: int, now: float) -> float:
        """Seconds since the counter passed ``xid`` (since the watch started, when before that):
        the last sample at which the counter had not yet passed it."""
        i = bisect.bisect_right(self.next_xids, xid)
        return now - (self.times[i - 1] if i else self.started)

    def _run(self) -> None:
        import psycopg

        try:
            self._sample_until_stopped()
        except psycopg.Error as exc:  # the database went away (a run interrupted, the bench's clean-up)
            self.error = str(exc)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tick:
                self.conn.execute(self.TICK)
            now = time.monotonic()
            rows = self.conn.execute(self.SAMPLE).fetchall()
            for app, seconds, xmin_age, next_xid, pid, xact_start in rows:
                self.applications.add(app)
                if xact_start is not None:
                    self.transactions.setdefault(app, set()).add((pid, xact_start))
                if seconds is not None and seconds > self.longest_s:
                    self.longest_s, self.longest_app = seconds, app
                if xmin_age is not None:
                    self.oldest_xmin_s = max(self.oldest_xmin_s, self._since(next_xid - int(xmin_age), now))
                    if xmin_age > self.oldest_xmin_age:
                        self.oldest_xmin_age, self.xmin_app = int(xmin_age), app
            if rows:
                self.times.append(now)
                self.next_xids.append(rows[0][3])
            self.samples += 1

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.conn.close()
        return {"longest_transaction_s": round(self.longest_s, 2), "longest_transaction_of": self.longest_app,
                "oldest_xmin_age": self.oldest_xmin_age, "oldest_xmin_s": round(self.oldest_xmin_s, 2),
                "oldest_xmin_of": self.xmin_app, "samples": self.samples, **({"error": self.error} if self.error else {})}


def postgres_cpu() -> float:
    """CPU seconds of the bench database's server so far (postmaster, reaped and live backends)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    postmaster = _cpu(backend)[0]
    total = _cpu(postmaster)[1]
    for p in os.listdir("/proc"):
        info = _cpu(int(p)) if p.isdigit() else None
        if info and info[0] == postmaster:
            with open(f"/proc/{p}/stat") as fh:  # a live backend: its own time only
                total += sum(int(x) for x in fh.read().rsplit(")", 1)[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")
    return total


def manage(env: dict, *args: str, label: str, watch: dict | None = None) -> tuple[float, float, float, str]:
    """Run ``manage.py`` (a Spark job) as a user would; wall seconds, its CPU, PostgreSQL's, output.
    ``watch`` (a dict) gets what a ``SnapshotWatch`` saw meanwhile."""
    pg = postgres_cpu()
    snapshots = SnapshotWatch(SnapshotWatch.conninfo())
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    cpu = TreeCpu(proc.pid)
    output = []
    for line in proc.stdout:
        output.append(line)
        if line.startswith("[pipeline]") or "report:" in line or "archive:" in line:
            print(f"  {label}: {line.rstrip()}", flush=True)
    code = proc.wait()
    seconds = time.monotonic() - started
    tree = cpu.stop()
    if watch is not None:
        watch.update(snapshots.stop())
    else:
        snapshots.stop()
    if code:
        sys.exit(f"{label} failed ({code}):\n{''.join(output)[-5000:]}")
    return round(seconds, 1), tree, round(postgres_cpu() - pg, 1), "".join(output)


def report_run(env: dict, out: Path, *, since: datetime, until: datetime, label: str, extra=()) -> dict:
    watch: dict = {}
    seconds, cpu, pg, _ = manage(env, "pipeline", "report", "--since", since.isoformat(), "--until",
                                 until.isoformat(), "--out", str(out), *extra, label=label, watch=watch)
    figures = json.loads((out / "report.json").read_text())
    rows = figures["jdbc_rows"]
    timings = figures["timings_s"]
    print(f"{label}: {figures['jobs']} jobs in {seconds}s with Spark start-up (report {timings['total']}s, "
          f"read {timings['read']}s); {rows['total']:,} rows read over JDBC (jobs {rows['jobs']:,}, "
          f"attempts {rows['attempts']:,}, transitions {rows['transitions']:,}); days: "
          f"{figures['facts']['days_from_facts']} from facts, {figures['facts']['days_read']} read, "
          f"{len(figures['facts']['days_written'])} written; CPU: report {cpu}s, PostgreSQL {pg}s; longest "
          f"transaction {watch['longest_transaction_s']}s ({watch['longest_transaction_of']}), oldest "
          f"snapshot {watch['oldest_xmin_age']} xids ({watch['oldest_xmin_s']}s) old", flush=True)
    return {"seconds": seconds, "report_s": figures["timings_s"], "jobs": figures["jobs"], "jdbc_rows": rows,
            "cpu_s": cpu, "postgres_cpu_s": pg, "complete": figures["complete"], "snapshots": watch,
            "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--new-jobs", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=60, help="the days the first jobs are spread over")
    parser.add_argument("--master", default=None, help="Spark master (default SPARK_MASTER or local[*])")
    parser.add_argument("--equality", action="store_true", help="archive, retention, a third report: equal")
    parser.add_argument("--rebuild-check", action="store_true", help="and a fourth, --rebuild: equal")
    parser.add_argument("--keep", action="store_true", help="keep the bench database and the output")
    args = smoke_args_parse(parser, jobs=2000, new_jobs=200, days=3)
    args.equality = args.equality or args.rebuild_check

    os.environ.setdefault("BROKER_LOG_LEVEL", "WARNING")
    out = Path(tempfile.mkdtemp(prefix="bench-pipeline-")) if args.smoke else ROOT / "bench" / "out" / "pipeline"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    results: dict = {"jobs_requested": args.jobs, "new_jobs": args.new_jobs}
    with database_server(smoke=args.smoke) as server_url:
        url, admin = database_prepare(server_url)
        try:
            results.update(run(args, url, out))
        finally:
            if not args.keep:
                database_drop(admin)
                shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(results, indent=1))


def run(args, url: str, out: Path) -> dict:
    """Fill, then the reports (and the equality check); returns the figures."""
    django_setup(url)
    from django.core.management import call_command

    results: dict = {}
    call_command("migrate", verbosity=0)
    registry_create(channels=CHANNELS, producers=PRODUCERS, consumers=CONSUMERS)
    now = datetime.now(timezone.utc)
    t = time.monotonic()
    messages_fill(messages=args.jobs // 2, span=timedelta(days=args.days), end=now - timedelta(minutes=30), tag="m-")
    results["generate_s"] = round(time.monotonic() - t, 1)
    results["rows"] = table_counts()
    print(f"generated {results['rows']} in {results['generate_s']}s", flush=True)

    env = base_env(url, BROKER_PIPELINE_DIR=out / "pipeline", BROKER_LOG_LEVEL="WARNING",
                   **({"SPARK_MASTER": args.master} if args.master else {}))
    since = now - timedelta(days=args.days + 1)
    first = report_run(env, out / "r1", since=since, until=datetime.now(timezone.utc), label="first report")
    assert first["jobs"] == results["rows"]["jobs_job"], (first["jobs"], results["rows"])  # all in the window

    t = time.monotonic()
    messages_fill(messages=args.new_jobs // 2, span=timedelta(minutes=10), end=datetime.now(timezone.utc),
                  tag="n-")
    results["generate_new_s"] = round(time.monotonic() - t, 1)
    until = datetime.now(timezone.utc)
    second = report_run(env, out / "r2", since=since, until=until, label="second report")
    assert second["jobs"] == first["jobs"] + args.new_jobs, (second["jobs"], first["jobs"])
    results["first"] = {k: v for k, v in first.items() if k != "figures"}
    results["second"] = {k: v for k, v in second.items() if k != "figures"}
    if args.equality:
        results["equality"] = equality_check(args, env, out, since=since, until=until, want=second["figures"])
    return results


def equality_check(args, env: dict, out: Path, *, since: datetime, until: datetime, want: dict) -> dict:
    """Archive, retention, then the second report's window again: equal figure for figure."""
    from django.conf import settings

    from jobs.sweeps.retention import retention_run

    result = {}
    archive_h, retention_h = f"{args.days * 22}h", args.days * 20  # 55 and 50 days of 60
    watch: dict = {}
    seconds, cpu, pg, text = manage(env, "pipeline", "archive", "--older-than", archive_h, "--dead-older-than",
                                    archive_h, label="archive", watch=watch)
    result["archive"] = {"seconds": seconds, "cpu_s": cpu, "postgres_cpu_s": pg, "snapshots": watch,
                         "summary": next((line for line in text.splitlines() if line.startswith("archive:")), "")}
    # retention reaches further back than the archive did: days 50 to 55 lose rows no archive holds
    settings.BROKER_RETENTION = settings.BROKER_DEAD_RETENTION = timedelta(hours=retention_h)
    t, removed = time.monotonic(), 0
    while True:
        rows = retention_run(budget=10, sweep_every=0).removed.rows
        removed += rows
        if not rows:
            break
    result["retention"] = {"rows_removed": removed, "seconds": round(time.monotonic() - t, 1)}
    print(f"{result['archive']['summary']} (longest transaction {watch['longest_transaction_s']}s, "
          f"{watch['longest_transaction_of']})\nretention: {removed} rows removed in "
          f"{result['retention']['seconds']}s", flush=True)
    third = report_run(env, out / "r3", since=since, until=until, label="third report")
    same = all(third["figures"][k] == want[k] for k in FIGURES) and third["complete"]
    result["third"] = {k: v for k, v in third.items() if k != "figures"} | {"equal": same}
    rebuilt = None
    if args.rebuild_check:
        fourth = report_run(env, out / "r4", since=since, until=until, label="fourth report (--rebuild)",
                            extra=("--rebuild",))
        rebuilt = all(fourth["figures"][k] == want[k] for k in FIGURES) and fourth["complete"]
        result["fourth"] = {k: v for k, v in fourth.items() if k != "figures"} | {"equal": rebuilt}
    print(f"equality: third report (facts) equal to the second: {'yes' if same else 'NO'}; rebuilt from the "
          f"archive: {'yes' if rebuilt else 'not run' if rebuilt is None else 'NO'}", flush=True)
    if not same or rebuilt is False:
        sys.exit("the reports differ")
    return result


if __name__ == "__main__":
    main()
