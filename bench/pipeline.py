"""Benchmark of the Spark pipeline: the report and archive-and-prune over 1,000,000 jobs.

    .venv/bin/python bench/pipeline.py [--jobs 1000000] [--master local[*]] [--keep] [--smoke]

Uses a database of its own (``broker_bench_pipeline``) on the embedded PostgreSQL under
``.data/postgres`` (or on the server of ``DATABASE_URL``; with ``--smoke`` and no DATABASE_URL a
throw-away server), creates the channels, producer and consumers through the broker's services
(so new registry columns need no change here) and fills messages, jobs and their history
server-side with ``INSERT ... SELECT generate_series`` (4 consumers on 2 channels, one message per
2 jobs, spread over 60 days; ~90% delivered, 4% dead, 6% pending; 0-3 attempts and 0-6 transitions
per job), runs the report over every job and archive-and-prune (older than 30 days, dead ones 45),
prints wall times, the Spark JVM's CPU seconds and the load average, then drops the database and
its output (unless ``--keep``). ``--smoke``: 2,000 jobs, the same steps.
Target: the report in under 60 s including Spark start-up, on the 2-core machine.

Recorded 2026-11-24 (2 cores, 24 GB, Java 17, pyspark 4.3.0, local[*], driver 4g with the C1 JIT
only, binary JDBC transfer, embedded PostgreSQL 18, fsync on; the machine was shared with other
engineers' test runs, so the load average is given with each figure):

    rows:    500,000 messages, 1,000,000 jobs, 2,250,000 transitions, 1,110,000 attempts (generated in 47.6 s)
    report:  1,000,000 jobs in 44.5 s + 7.4 s Spark start-up = 51.9 s, JVM CPU 37.6 s, load average 2.0-3.5
             phases: JDBC read streamed into Parquet by day/channel 24.6 s, aggregates 19.6 s, HTML 0.3 s
             (a second run at load 3.4-3.8: 59.5 s + 6.6 s = 66.1 s, JVM CPU 38.9 s)
    archive: --older-than 30d --dead-older-than 45d: 210,007 messages, 420,014 jobs, 962,530 transitions,
             481,265 attempts (2.07M rows) in 73.9 s = 28.1k rows/s, JVM CPU 60.7 s
             phases: export 46.7 s, read-back verify 12.3 s, publish 0.1 s, prune 14.9 s

Before (the code of 5262216: text JDBC results, an in-memory cache of the facts, the C2 JIT), the
same command in the same session on a quieter machine: report 33.3 s + 10.4 s = 43.7 s, JVM CPU
45.1 s, load 1.2-1.9 (and 62.0 s + 16.5 s = 78.5 s at load 6-8 the day before); archive 87.1 s,
JVM CPU 52.8 s (export 40.1 s, verify 25.7 s, prune 20.9 s).
The report alone, old and new code alternating over one database, three pairs (load 1.9-3.7):
old 41.9 / 48.6 / 35.5 s with start-up, JVM CPU 58.1 / 63.1 / 56.4 s; new 42.6 / 34.3 / 30.8 s,
JVM CPU 43.4 / 40.9 / 39.4 s. The CPU (-30%) is the figure load changes least.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import broker_database, django_setup, registry_create, smoke_args_parse  # noqa: E402

BENCH_DB = "broker_bench_pipeline"
SMOKE_TABLE = (r"^report: \d+ jobs in [\d.]+s \([\d.]+s with Spark start-up; JVM CPU .*\)$(?s:.*)"
               r"^archive: \{.*\} in [\d.]+s \(\d+ rows/s, export \+ verify \+ prune; .*\)$")
SMOKE_NEEDS = ("spark",)
CHANNELS = ["bench-ch0", "bench-ch1"]
PRODUCERS = ["bench-producer"]
CONSUMERS = [(ch, f"{ch}-c{k}", "push", "http://127.0.0.1:9/cb") for ch in CHANNELS for k in range(2)]


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
    """URL of the server to use: DATABASE_URL's, else the embedded one under .data/postgres (a
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


GENERATE_SQL = [
    # channels, producer and consumers come from registry_create (CHANNELS, PRODUCERS, CONSUMERS)
    # messages spread evenly over the last 60 days
    """INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                                  status, received_at, dispatched_at)
       SELECT (SELECT array_agg(id ORDER BY id) FROM broker_channel)[1 + g %% 2], 'm-' || g,
              (SELECT id FROM broker_producer), convert_to('{"n": ' || g || '}', 'UTF8'), 'application/json', g %% 3,
              jsonb_build_object('X-Trace', 't' || g), 102,
              now() - (g::float8 / %(messages)s) * interval '60 days',
              now() - (g::float8 / %(messages)s) * interval '60 days'
         FROM generate_series(1, %(messages)s) g""",
    # one job per (message, consumer of its channel): ~90%% delivered, 4%% dead, 3%% queued, 3%% in flight
    """INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                            incremental_timeout, status_changed_at, created_at)
       SELECT m.id, c.id, c.channel_id, s.status, m.priority, s.retry, m.received_at, 0,
              m.received_at + (((m.id * 31 + c.id * 17) %% 5000) * interval '1 millisecond')
                            + s.retry * interval '30 seconds', m.received_at
         FROM broker_message m JOIN consumers_consumer c ON c.channel_id = m.channel_id
         CROSS JOIN LATERAL (SELECT (m.id * 7 + c.id * 13) %% 100 AS h) x
         CROSS JOIN LATERAL (SELECT CASE WHEN x.h < 90 THEN 1003 WHEN x.h < 94 THEN 1004
                                         WHEN x.h < 97 THEN 1001 ELSE 1002 END AS status,
                                    CASE WHEN x.h < 90 THEN (x.h %% 10 = 0)::int WHEN x.h < 94 THEN 3
                                         ELSE 0 END AS retry) s""",
    # history: each try is a claim then a failure (back to QUEUED, or DEAD the last time); then
    # the final claim and DELIVERED for delivered jobs, a claim for in-flight ones
    """INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
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
             SELECT 1002, 1003, j.retry_count, 'ack',
                    extract(epoch FROM j.status_changed_at - j.created_at) WHERE j.status = 1003
         ) v""",
    # attempts: one per failed try (500/503/timeout) plus the successful one
    """INSERT INTO jobs_deliveryattempt (job_id, attempt, started_at, duration_ms, status_code, response_excerpt,
                                        error, request_id, outcome)
       SELECT j.id, r + 1, j.created_at + r * interval '30 seconds', 20 + (j.id %% 200),
              CASE WHEN r < j.retry_count THEN (ARRAY[500, 503, NULL])[1 + (j.id + r) %% 3] ELSE 200 END,
              '', CASE WHEN r < j.retry_count AND (j.id + r) %% 3 = 2 THEN 'ReadTimeout: timed out' ELSE '' END,
              '', CASE WHEN r < j.retry_count THEN 'failed' ELSE 'delivered' END
         FROM jobs_job j
         CROSS JOIN LATERAL generate_series(0, j.retry_count - CASE WHEN j.status = 1003 THEN 0 ELSE 1 END) r
        WHERE j.status IN (1003, 1004)""",
    "ANALYZE",
]


def jvm_cpu_seconds() -> float:
    """CPU seconds used so far by this process's children (the Spark JVM in local mode): a
    figure that other work on a shared machine changes far less than wall time."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            total += int(fields[11]) + int(fields[12])
    return total / tick


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def table_counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        counts = {}
        for table in ("broker_message", "jobs_job", "jobs_jobtransition", "jobs_deliveryattempt"):
            cur.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cur.fetchone()[0]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--master", default=None, help="Spark master (default SPARK_MASTER or local[*])")
    parser.add_argument("--keep", action="store_true", help="keep the bench database and the output")
    parser.add_argument("--generate-only", action="store_true", help="only fill the bench database (kept)")
    args = smoke_args_parse(parser, jobs=2000)
    args.keep = args.keep or args.generate_only

    os.environ.setdefault("BROKER_LOG_LEVEL", "WARNING")
    out = Path(tempfile.mkdtemp(prefix="bench-pipeline-")) if args.smoke else ROOT / "bench" / "out" / "pipeline"
    shutil.rmtree(out, ignore_errors=True)
    results: dict = {"jobs_requested": args.jobs}
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
    """Generate the rows, then time the report and the archive; returns the figures."""
    django_setup(url)
    from django.core.management import call_command
    from django.db import connection

    results: dict = {}
    call_command("migrate", verbosity=0)
    t = time.monotonic()
    registry_create(channels=CHANNELS, producers=PRODUCERS, consumers=CONSUMERS)
    with connection.cursor() as cur:
        for sql in GENERATE_SQL:
            cur.execute(sql, {"messages": args.jobs // 2})
    counts = table_counts()
    results["generate_s"] = round(time.monotonic() - t, 1)
    results["rows"] = counts
    print(f"generated {counts} in {results['generate_s']}s", flush=True)
    if args.generate_only:
        return results

    from pipeline.archive import messages_archive
    from pipeline.report import pipeline_report_build
    from pipeline.session import spark_session_build
    from pipeline.timeparse import moment_parse

    t = time.monotonic()
    spark = spark_session_build(master=args.master)
    results["spark_start_s"] = round(time.monotonic() - t, 1)
    print(f"Spark {spark.version} on {spark.sparkContext.master} started in {results['spark_start_s']}s", flush=True)

    t, cpu = time.monotonic(), jvm_cpu_seconds()
    results["load_avg_before_report"] = load_average()
    report = pipeline_report_build(spark=spark, since=moment_parse("61d"), out_dir=out / "report",
                                   record_latest=False, progress=lambda m: print("  report:", m, flush=True))
    results["report_s"] = round(time.monotonic() - t, 1)
    results["report_jvm_cpu_s"] = round(jvm_cpu_seconds() - cpu, 1)
    results["report_with_startup_s"] = round(results["report_s"] + results["spark_start_s"], 1)
    results["report_jobs"] = report.jobs
    results["report_jobs_per_s"] = round(report.jobs / results["report_with_startup_s"])
    results["report_phases_s"] = {k: round(v, 1) for k, v in report.timings.items()}
    print(f"report: {report.jobs} jobs in {results['report_s']}s "
          f"({results['report_with_startup_s']}s with Spark start-up; JVM CPU {results['report_jvm_cpu_s']}s; "
          f"load average before {results['load_avg_before_report']})", flush=True)
    assert report.jobs == counts["jobs_job"], (report.jobs, counts)  # every job is inside the 61 days

    t, cpu = time.monotonic(), jvm_cpu_seconds()
    archive = messages_archive(spark=spark, out_dir=out / "archive", older_than="30d", dead_older_than="45d",
                               progress=lambda m: print("  archive:", m, flush=True))
    results["archive_s"] = round(time.monotonic() - t, 1)
    results["archive_jvm_cpu_s"] = round(jvm_cpu_seconds() - cpu, 1)
    exported = sum(archive.exported.values())
    results["archive_exported"] = archive.exported
    results["archive_pruned"] = archive.pruned
    results["archive_phases_s"] = {k: round(v, 1) for k, v in archive.timings.items()}
    results["archive_rows_per_s"] = round(exported / results["archive_s"]) if results["archive_s"] else 0
    print(f"archive: {archive.exported} in {results['archive_s']}s ({results['archive_rows_per_s']} rows/s, "
          f"export + verify + prune; JVM CPU {results['archive_jvm_cpu_s']}s; load average after {load_average()})",
          flush=True)
    after = table_counts()
    assert archive.pruned["messages"] > 0, archive.pruned  # messages are spread over 60 days
    assert after["broker_message"] == counts["broker_message"] - archive.pruned["messages"]
    spark.stop()
    return results


if __name__ == "__main__":
    main()
