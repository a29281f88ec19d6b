"""Replay beside publishing: publish throughput alone vs while a replay runs, in the same run.

Issue 17: a replay works in chunks (10,000 messages a statement, each its own transaction) so a
replay of a million messages never holds long locks and slows concurrent publishing by at most
20%. This loads ``--backlog`` messages (default 100,000) into a channel whose pull consumer
``target`` already has every job DELIVERED, then measures single-broadcast publishing to the
same channel over HTTP (gunicorn, as users run it): alone, during ``POST .../replay`` of the whole
backlog to ``target`` (publishing runs in rounds for as long as the replay does), and alone again.
Prints msg/s of each phase and the ratio during / alone (alone = the mean of both alone phases).

    python bench/replay.py [--backlog 100000] [--round 300] [--concurrency 8]

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import requests  # noqa: E402

from bench.common import (ADMIN, broker_served, build_request, run_load, smoke_args_parse,  # noqa: E402
                          smoke_problems_exit)

SMOKE_TABLE = (r"^phase +msg/s +requests +seconds$(?s:.*)^publishing during the replay +\d+ +\d+ +[\d.]+$"
               r"(?s:.*)^ratio during / alone: [\d.]+$")
CHANNEL = "replay-bench"
PAYLOAD = json.dumps({"event": "order.created", "id": 12345, "note": "x" * 200}).encode()
HEADERS = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "bench", "X-Broker-Producer-Token": "pt",
           "Content-Type": "application/json"}

# The backlog: messages received over the last hour, each with a DELIVERED job of ``target`` and a
# QUEUED job of ``other`` (bench setup, written directly like tests/plans: the replay is what is measured).
_BACKLOG_MESSAGES = """
INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                            status, received_at, dispatched_at)
SELECT %(ch)s, 'backlog-' || g, %(pr)s, %(payload)s, 'application/json', 0, '{}', 102,
       now() - interval '1 hour' + g * interval '1 ms', now()
  FROM generate_series(1, %(n)s) g
"""
_BACKLOG_JOBS = """
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      incremental_timeout, status_changed_at, created_at)
SELECT m.id, c.id, m.channel_id, CASE WHEN c.consumer_id = 'target' THEN 1003 ELSE 1001 END, 0, 0, now(), 0,
       now(), now()
  FROM broker_message m JOIN consumers_consumer c ON c.channel_id = m.channel_id
 WHERE m.channel_id = %(ch)s
 ORDER BY m.id
"""


def setup(url: str, database_url: str, backlog: int) -> None:
    admin = {"X-Broker-Admin-Token": ADMIN}
    requests.put(f"{url}/channel/{CHANNEL}", data={"token": "ct"}, headers=admin).raise_for_status()
    requests.put(f"{url}/producer/bench", data={"token": "pt"}, headers=admin).raise_for_status()
    for name in ("target", "other"):
        requests.put(f"{url}/channel/{CHANNEL}/consumer/{name}", data={"token": "t", "type": "pull"},
                     headers=admin).raise_for_status()
    with psycopg.connect(database_url) as conn:
        ch, pr = conn.execute("SELECT c.id, p.id FROM broker_channel c, broker_producer p "
                              "WHERE c.channel_id = %s AND p.producer_id = 'bench'", [CHANNEL]).fetchone()
        conn.execute(_BACKLOG_MESSAGES, {"ch": ch, "pr": pr, "payload": PAYLOAD, "n": backlog})
        conn.execute(_BACKLOG_JOBS, {"ch": ch})
        conn.execute("ANALYZE broker_message")
        conn.execute("ANALYZE jobs_job")


def publish_round(url: str, n: int, concurrency: int, problems: list[str]) -> float:
    """One round of ``n`` single broadcasts; returns its elapsed seconds."""
    run = uuid.uuid4().hex[:10]

    def make(i):
        return build_request("POST", f"/channel/{CHANNEL}/broadcast", {**HEADERS, "X-Broker-Message-ID": f"{run}-{i}"},
                             PAYLOAD)

    elapsed, statuses, _ = asyncio.run(run_load(url, make, n, concurrency))
    if statuses != {201: n}:
        problems.append(f"publishing answered {statuses}")
    return elapsed


def publish_alone(url: str, rounds: int, n: int, concurrency: int, problems: list[str]) -> tuple[float, int, float]:
    elapsed = sum(publish_round(url, n, concurrency, problems) for _ in range(rounds))
    return rounds * n / elapsed, rounds * n, elapsed


def publish_during_replay(url: str, n: int, concurrency: int, problems: list[str]) -> tuple[tuple, dict, float]:
    """Publish in rounds while ``POST .../replay`` of the whole window runs; rounds that started
    while it ran count. Returns ((msg/s, requests, seconds), the replay's answer, its seconds)."""
    answer: dict = {}

    def run_replay():
        t0 = time.perf_counter()
        r = requests.post(f"{url}/channel/{CHANNEL}/consumer/target/replay", json={"since": "2000-01-01T00:00:00Z"},
                          headers={"X-Broker-Admin-Token": ADMIN}, timeout=600)
        answer.update(status=r.status_code, body=r.json() if r.content else None, seconds=time.perf_counter() - t0)

    thread = threading.Thread(target=run_replay)
    thread.start()
    time.sleep(0.05)
    sent, elapsed = 0, 0.0
    while thread.is_alive():
        elapsed += publish_round(url, n, concurrency, problems)
        sent += n
    thread.join()
    if answer.get("status") != 202:
        problems.append(f"replay answered {answer}")
    return (sent / elapsed if elapsed else 0.0, sent, elapsed), answer, answer.get("seconds", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000, help="messages in the replayed window")
    parser.add_argument("--round", type=int, default=300, help="broadcasts per publishing round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each 'alone' phase")
    parser.add_argument("--concurrency", type=int, default=8)
    args = smoke_args_parse(parser, backlog=3000, round=50, rounds=2, concurrency=4)
    problems: list[str] = []
    with broker_served(workers=2) as (server, database_url):
        setup(server.url, database_url, args.backlog)
        publish_round(server.url, args.round, args.concurrency, problems)  # warm-up
        before = publish_alone(server.url, args.rounds, args.round, args.concurrency, problems)
        during, answer, replay_seconds = publish_during_replay(server.url, args.round, args.concurrency, problems)
        after = publish_alone(server.url, args.rounds, args.round, args.concurrency, problems)
    body = answer.get("body") or {}
    if body.get("Replayed") != args.backlog:
        problems.append(f"replay answered {body}, expected Replayed {args.backlog}")
    load = os.getloadavg()
    print(f"replay benchmark: backlog {args.backlog:,} messages, publishing concurrency {args.concurrency}, "
          f"rounds of {args.round}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"replay: {body} in {replay_seconds:.2f} s ({args.backlog / max(replay_seconds, 1e-9):,.0f} messages/s)")
    print(f"{'phase':34} {'msg/s':>8} {'requests':>9} {'seconds':>8}")
    for name, (rate, sent, seconds) in (("publishing alone (before)", before), ("publishing during the replay", during),
                                        ("publishing alone (after)", after)):
        print(f"{name:34} {rate:8.0f} {sent:9d} {seconds:8.2f}")
    alone = (before[0] + after[0]) / 2
    print(f"ratio during / alone: {during[0] / alone if alone else 0:.2f}")
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
