"""The operator's admin on a large database: dashboard and list render times, and the write cost
of the per-minute statistics triggers (jobs/migrations/0011_dashboard_minute_stats.py).

Builds a database with --jobs jobs (5 consumers per channel; about 1% dead, 2% queued), an hour of
per-minute statistics from 8 connections per consumer, then prints the median of 5 renders of:
the dashboard (admin index), the dead-jobs list, a consumer's dead jobs, the consumer list, a job
page; and, from EXPLAIN ANALYZE, the time the statistics trigger and the counter trigger add to a
500-job ack statement and to a single-job ack.

    python bench/dashboard.py [--jobs 1000000] [--channels 4]

Uses DATABASE_URL when set (it must be a throw-away database), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from bench.common import (base_env, broker_database, django_setup, manage, registry_create,  # noqa: E402
                          smoke_args_parse)

CONSUMERS_PER_CHANNEL = 5
SMOKE_TABLE = r"^write cost of the triggers:\n(?s:.*)^render times .*\n(?s:.*)^  a dead job's page +median +[\d.]+ ms"


def build(url: str, jobs: int, channels: int) -> None:
    messages = jobs // CONSUMERS_PER_CHANNEL
    names = [f"ch{i}" for i in range(1, channels + 1)]
    registry_create(channels=names, producers=["p"], consumers=[
        (ch, f"c{i}", "pull" if i % 2 == 0 else "push", "http://127.0.0.1:9/")
        for ch in names for i in range(1, CONSUMERS_PER_CHANNEL + 1)])
    with psycopg.connect(url, autocommit=True) as conn:
        step = 100_000
        for start in range(0, messages, step):
            n = min(step, messages - start)
            with conn.transaction():
                conn.execute(
                    """
                    WITH m AS (
                        INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type,
                                                    priority, headers, status, received_at, dispatched_at)
                        SELECT (SELECT id FROM broker_channel ORDER BY id OFFSET g %% %(channels)s LIMIT 1),
                               'm' || g, (SELECT id FROM broker_producer LIMIT 1),
                               convert_to('{"n": ' || g || '}', 'UTF8'), 'application/json', 0, '{}', 102,
                               now() - (%(total)s - g) * interval '100 ms', now()
                          FROM generate_series(%(start)s::int, %(end)s::int) g
                        RETURNING id, channel_id, received_at
                    )
                    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                                          next_attempt_at, incremental_timeout, status_changed_at, created_at)
                    SELECT m.id, c.id, m.channel_id,
                           CASE WHEN m.id %% 100 = 0 THEN 1004 WHEN m.id %% 50 = 1 THEN 1001 ELSE 1003 END,
                           0, 0, m.received_at, 0, m.received_at, m.received_at
                      FROM m JOIN consumers_consumer c ON c.channel_id = m.channel_id
                    """,
                    {"channels": channels, "total": messages, "start": start + 1, "end": start + n},
                )
            print(f"  {start + n:,} / {messages:,} messages", flush=True)
        # an hour of traffic as 8 connections per consumer would leave it
        conn.execute(
            "INSERT INTO jobs_minutestat (minute, consumer_id, pid, created, delivered, retried, dead, requeued)"
            " SELECT date_trunc('minute', now()) - m * interval '1 minute', c.id, p, 50, 48, 2, 0, 0"
            " FROM consumers_consumer c, generate_series(1, 59) m, generate_series(1, 8) p ON CONFLICT DO NOTHING")
        conn.execute("VACUUM ANALYZE")


def trigger_costs(url: str) -> None:
    """Trigger times from EXPLAIN ANALYZE (server-side, so machine noise from other clients is small)."""
    def explain(conn, sql: str) -> dict[str, float]:
        rows = conn.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + sql).fetchall()
        out = {}
        for (line,) in rows:
            if line.startswith("Execution Time: "):
                out["whole statement"] = float(line.split()[2])
            if line.startswith("Trigger "):
                name, rest = line[len("Trigger "):].split(": time=")
                out[f"trigger {name}"] = float(rest.split()[0])
        return out

    with psycopg.connect(url) as conn:
        for size in (500, 1):
            samples: dict[str, list[float]] = {}
            for _ in range(7):
                with conn.transaction(force_rollback=True):
                    conn.execute("UPDATE jobs_job SET status = 1002 WHERE id IN (SELECT id FROM jobs_job "
                                 "WHERE status = 1001 ORDER BY id LIMIT %s)", [size])
                    times = explain(conn, f"UPDATE jobs_job SET status = 1003 WHERE id IN (SELECT id FROM jobs_job "
                                          f"WHERE status = 1002 ORDER BY id LIMIT {size})")
                for name, ms in times.items():
                    samples.setdefault(name, []).append(ms)
            for name, values in sorted(samples.items()):
                print(f"  ack of {size:>3} job(s): {name:<32} median {statistics.median(values):.3f} ms")


def render_times() -> None:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from broker.xid import job_xid
    from consumers.models import Consumer
    from jobs.models import Job
    from jobs.ops.dashboard import dashboard_snapshot

    settings.ALLOWED_HOSTS = ["testserver"]
    user = User.objects.create_superuser("bench", password="bench-password")
    client = Client()
    client.force_login(user)
    consumer = Consumer.objects.order_by("id").first()
    job = Job.objects.filter(status=1004).order_by("-id").first()
    pages = {
        "dashboard_snapshot() (queries only)": None,
        "/admin/ (dashboard)": "/admin/",
        "/admin/jobs/job/?status__exact=1004": "/admin/jobs/job/?status__exact=1004",
        "one consumer's dead jobs": f"/admin/jobs/job/?status__exact=1004&consumer={consumer.pk}",
        "/admin/jobs/job/ (all)": "/admin/jobs/job/",
        "/admin/consumers/consumer/": "/admin/consumers/consumer/",
        "a dead job's page": f"/admin/jobs/job/{job_xid(job.pk)}/change/",  # addressed by its job ID
    }
    for label, url_ in pages.items():
        times = []
        for _ in range(6):
            start = time.perf_counter()
            if url_ is None:
                dashboard_snapshot()
            else:
                assert client.get(url_).status_code == 200
            times.append((time.perf_counter() - start) * 1000)
        print(f"  {label:<40} median {statistics.median(times[1:]):7.1f} ms  (first {times[0]:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=4)
    args = smoke_args_parse(parser, jobs=2000, channels=2)
    with broker_database() as url:
        manage(base_env(url), "migrate", "-v", "0")
        django_setup(url)
        print(f"building {args.jobs:,} jobs for {args.channels * CONSUMERS_PER_CHANNEL} consumers ...", flush=True)
        started = time.perf_counter()
        build(url, args.jobs, args.channels)
        print(f"  built in {time.perf_counter() - started:.0f} s")
        print("write cost of the triggers:")
        trigger_costs(url)
        print("render times (Django test client, in process):")
        render_times()


if __name__ == "__main__":
    main()
