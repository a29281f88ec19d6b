"""Publish throughput over HTTP against gunicorn (2 workers, as users run it).

Prints messages/s for single broadcasts to a channel with 1 and with 5 consumers, and for the
batch endpoint, next to the raw insert rate of the same rows (message + its jobs, one transaction
per message / per batch) straight through psycopg in the same run.

    python bench/publish.py [--messages 6000] [--batches 40] [--concurrency 16]

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL. Targets on the 2-core
machine: >= 1,000 single broadcasts/s and >= 15,000 messages/s batched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import requests  # noqa: E402

from bench.common import ADMIN, broker_served, build_request, run_load, sizes_add, smoke_args_parse  # noqa: E402

SMOKE_TABLE = r"^case +HTTP msg/s +raw psycopg msg/s +ratio$(?s:.*)^batch of 1000, 5 consumer\(s\) +\d+ +\d+ +[\d.]+$"
PAYLOAD = json.dumps({"event": "order.created", "id": 12345, "items": [1, 2, 3], "note": "x" * 200}).encode()


def setup(url: str, channel: str, consumers: int) -> None:
    admin = {"X-Broker-Admin-Token": ADMIN}
    requests.put(f"{url}/channel/{channel}", data={"token": "ct"}, headers=admin).raise_for_status()
    if requests.get(f"{url}/producer/bench", headers=admin).status_code == 404:
        requests.put(f"{url}/producer/bench", data={"token": "pt"}, headers=admin).raise_for_status()
    for i in range(consumers):
        requests.put(f"{url}/channel/{channel}/consumer/c{i}", data={"token": "t", "type": "pull"},
                     headers=admin).raise_for_status()


def single(url: str, channel: str, total: int, concurrency: int, extra_headers: dict | None = None,
           payload: bytes = PAYLOAD) -> float:
    run = uuid.uuid4().hex[:8]
    headers = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "bench", "X-Broker-Producer-Token": "pt",
               "Content-Type": "application/json", **(extra_headers or {})}

    def make(i):
        return build_request("POST", f"/channel/{channel}/broadcast",
                             {**headers, "X-Broker-Message-ID": f"{run}-{i}"}, payload)

    elapsed, statuses, _ = asyncio.run(run_load(url, make, total, concurrency))
    assert statuses == {201: total}, statuses
    return total / elapsed


def batched(url: str, channel: str, batches: int, concurrency: int, size: int = 1000) -> float:
    run = uuid.uuid4().hex[:8]
    headers = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "bench", "X-Broker-Producer-Token": "pt",
               "Content-Type": "application/json"}
    payload = PAYLOAD.decode()

    def make(i):
        body = json.dumps([{"MessageID": f"{run}-{i}-{k}", "Payload": payload, "ContentType": "application/json"}
                           for k in range(size)]).encode()
        return build_request("POST", f"/channel/{channel}/messages", headers, body)

    elapsed, statuses, _ = asyncio.run(run_load(url, make, batches, concurrency))
    assert statuses == {201: batches}, statuses
    return batches * size / elapsed


RAW_MESSAGE = """
INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                            status, received_at, dispatched_at)
SELECT %(ch)s, t.mid, %(pr)s, %(payload)s, 'application/json', 0, '{}', 102, now(), now()
  FROM unnest(%(mids)s::text[]) AS t(mid)
RETURNING id
"""
RAW_JOBS = """
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      incremental_timeout, status_changed_at, created_at)
SELECT m, c.id, c.channel_id, 1001, 0, 0, now(), 0, now(), now()
  FROM unnest(%(ids)s::bigint[]) AS m JOIN consumers_consumer c ON c.channel_id = %(ch)s
"""


def raw(database_url: str, channel: str, total: int, concurrency: int, per_tx: int) -> float:
    """The same rows inserted straight through psycopg: per_tx messages per transaction."""
    with psycopg.connect(database_url) as conn:
        ch, pr = conn.execute(
            "SELECT c.id, p.id FROM broker_channel c, broker_producer p WHERE c.channel_id = %s AND p.producer_id = 'bench'",
            [channel]).fetchone()
    run = uuid.uuid4().hex[:8]
    counter = iter(range(0, total, per_tx))
    lock = threading.Lock()

    def work():
        with psycopg.connect(database_url) as conn:
            while True:
                with lock:
                    start = next(counter, None)
                if start is None:
                    return
                with conn.transaction():
                    mids = [f"raw-{run}-{start + k}" for k in range(per_tx)]
                    ids = [r[0] for r in conn.execute(RAW_MESSAGE, {"ch": ch, "pr": pr, "payload": PAYLOAD,
                                                                      "mids": mids}).fetchall()]
                    conn.execute(RAW_JOBS, {"ids": ids, "ch": ch})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes_add(parser, messages=6000, batches=40, concurrency=16, workers=2)
    args = smoke_args_parse(parser, messages=200, batches=2, concurrency=4)
    with broker_served(workers=args.workers) as (server, database_url):
        setup(server.url, "bench-1", 1)
        setup(server.url, "bench-5", 5)
        single(server.url, "bench-1", min(500, args.messages), args.concurrency)  # warm-up
        rows = []
        for channel, n in (("bench-1", 1), ("bench-5", 5)):
            http = single(server.url, channel, args.messages, args.concurrency)
            base = raw(database_url, channel, args.messages, args.concurrency, 1)
            rows.append((f"single broadcast, {n} consumer(s)", http, base))
        for channel, n in (("bench-1", 1), ("bench-5", 5)):
            http = batched(server.url, channel, args.batches, 2)
            base = raw(database_url, channel, args.batches * 1000, 2, 1000)
            rows.append((f"batch of 1000, {n} consumer(s)", http, base))
    print(f"publish benchmark: gunicorn {args.workers} workers, concurrency {args.concurrency}, "
          f"{len(PAYLOAD)}-byte JSON payload")
    print(f"{'case':34} {'HTTP msg/s':>12} {'raw psycopg msg/s':>18} {'ratio':>7}")
    for name, http, base in rows:
        print(f"{name:34} {http:12.0f} {base:18.0f} {http / base:7.2f}")


if __name__ == "__main__":
    main()
