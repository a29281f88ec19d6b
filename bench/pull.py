"""Pull-consumer throughput over HTTP against gunicorn (2 workers, as users run it).

For a backlog of 200,000 jobs per consumer, prints jobs/s through
  1. the spec path: GET queued-jobs (limit 25) + POST job INFLIGHT + POST job DELIVERED per job,
     with 1 client and with 8 concurrent clients (claims carry an IncrementalTimeout, so a lost race
     is a 400 and the client moves on; each of the 8 tries 10 random jobs of a 100-job page),
  2. the fast path: POST pull (batch 100) + POST ack (100 outcomes), 4 concurrent clients,
  3. the raw PostgreSQL limit in the same run: the same claim (SKIP LOCKED, batch 100, returning
     the payloads) and ack straight through psycopg, 4 client processes, no HTTP,
  4. the Python client (client/): broker_client's consume() with batch 100, 4 processes (target:
     >= 80% of the fast path in the same run),
and the ratios. The counter deltas are folded every 5 s meanwhile, as the workers do (they are not
running here). Targets on the 2-core machine: fast path >= 0.5 x the raw limit (at 200k and at 1M),
spec path >= 500/s with 1 client and >= 1,000/s with 8 (200k backlog).

    python bench/pull.py [--backlog 200000] [--clients 4] [--batch 100] [--spec-seconds 10] [--seconds 60]
    python bench/pull.py --backlog 1000000
    python bench/pull.py --baseline    # also the spec path on a second gunicorn without the fast lane and
                                       # with durable commits (BROKER_FAST_LANE / _ASYNC_COMMIT off),
                                       # phases alternating with the default one, and the ratios

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL (fsync on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import requests  # noqa: E402

from bench.common import sizes_add, smoke_args_parse  # noqa: E402
from bench.common import (ADMIN, _read_response, base_env, broker_database, build_request, manage,  # noqa: E402
                          start_gunicorn)

PAYLOAD = json.dumps({"event": "order.created", "id": 12345, "items": [1, 2, 3], "note": "x" * 200}).encode()
CONSUMERS = ("spec", "fast", "raw", "client")
SMOKE_TABLE = r"^path +jobs/s +vs raw .*\n^spec: .*\n^spec: .*\n^fast: .*\n^raw SQL .*\n^client: .*\n^targets: "


def setup(url: str) -> None:
    admin = {"X-Broker-Admin-Token": ADMIN}
    requests.put(f"{url}/channel/bench", data={"token": "ct"}, headers=admin).raise_for_status()
    requests.put(f"{url}/producer/bench", data={"token": "pt"}, headers=admin).raise_for_status()
    for name in CONSUMERS:
        requests.put(f"{url}/channel/bench/consumer/{name}", data={"token": "t", "type": "pull"},
                     headers=admin).raise_for_status()


def backlog(database_url: str, n: int) -> None:
    """n messages, each with one QUEUED job per consumer, inserted in bulk (publishing is measured
    by bench/publish.py); then VACUUM ANALYZE so every phase starts from a clean table."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        ch, pr = conn.execute("SELECT c.id, p.id FROM broker_channel c, broker_producer p "
                              "WHERE c.channel_id = 'bench' AND p.producer_id = 'bench'").fetchone()
        for start in range(0, n, 50_000):
            with conn.transaction():
                conn.execute(
                    """
                    WITH m AS (
                        INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type,
                                                    priority, headers, status, received_at, dispatched_at)
                        SELECT %(ch)s, 'b' || g, %(pr)s, %(payload)s, 'application/json', 0, '{}', 102, now(), now()
                          FROM generate_series(%(a)s::int, %(b)s::int) g
                        RETURNING id, channel_id
                    )
                    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                                          next_attempt_at, incremental_timeout, status_changed_at, created_at)
                    SELECT m.id, c.id, c.channel_id, 1001, 0, 0, now(), 0, now(), now()
                      FROM m JOIN consumers_consumer c ON c.channel_id = m.channel_id
                     ORDER BY m.id, c.id
                    """,
                    {"ch": ch, "pr": pr, "payload": PAYLOAD, "a": start, "b": min(n, start + 50_000) - 1},
                )
        vacuum(conn)


def vacuum(conn) -> None:
    conn.execute("SELECT 1")
    for table in ("jobs_job", "jobs_jobtransition", "broker_counterdelta", "broker_message"):
        conn.execute(f"VACUUM ANALYZE {table}")


# --- CPU accounting: the machine may be shared, so also report CPU time per job --------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, int]:
    """(ppid, own cpu ticks, cpu ticks of waited-for children) of a process."""
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def tree_cpu(root: int | None) -> float:
    """CPU seconds of a process, its exited children and its live children (gunicorn arbiter +
    workers, postmaster + backends). 0 when unknown."""
    if not root:
        return 0.0
    try:
        _, own, waited = _stat(root)
    except OSError:
        return 0.0
    total = own + waited
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid, ticks, _ = _stat(int(entry))
            except (OSError, IndexError, ValueError):
                continue
            if ppid == root:
                total += ticks
    return total / TICK


def client_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def postmaster_pid(database_url: str) -> int | None:
    """The local PostgreSQL server's pid (parent of our backend), or None if it is not local."""
    try:
        with psycopg.connect(database_url) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        ppid = _stat(backend)[0]
        with open(f"/proc/{ppid}/comm") as fh:
            return ppid if "postgres" in fh.read() else None
    except (OSError, psycopg.Error):
        return None


class Cpu:
    """CPU seconds spent by the web server, the database server and this client during a phase."""

    def __init__(self, web_pid: int | None, db_pid: int | None):
        self.pids = (web_pid, db_pid)

    def __enter__(self):
        self.start = (tree_cpu(self.pids[0]), tree_cpu(self.pids[1]), client_cpu())
        return self

    def __exit__(self, *exc):
        end = (tree_cpu(self.pids[0]), tree_cpu(self.pids[1]), client_cpu())
        self.web, self.db, self.client = (b - a for a, b in zip(self.start, end))

    def per_job(self, jobs: int) -> str:
        if not jobs:
            return "-"
        ms = lambda v: v * 1000 / jobs  # noqa: E731
        return f"{ms(self.web):.3f} + {ms(self.db):.3f} + {ms(self.client):.3f}"


# --- HTTP clients (asyncio, keep-alive, little CPU next to the server) --------------------------------

HEADERS = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "t", "Content-Type": "application/json"}


async def _call(reader, writer, method: str, path: str, body: bytes = b""):
    writer.write(build_request(method, path, HEADERS, body))
    status, _, data = await _read_response(reader)
    return status, data


async def spec_client(url: str, stop_at: float, counts: dict, seed: int, page: int = 25, tries: int = 25) -> None:
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    base = "/channel/bench/consumer/spec"
    rng = random.Random(seed)
    claim = json.dumps({"NextState": "INFLIGHT", "IncrementalTimeout": 60}).encode()
    deliver = json.dumps({"NextState": "DELIVERED"}).encode()
    try:
        while time.perf_counter() < stop_at:
            status, data = await _call(reader, writer, "GET", f"{base}/queued-jobs?limit={page}")
            assert status == 200, (status, data)
            jobs = json.loads(data)["Result"]
            if not jobs:
                return
            # concurrent clients see the same page: each tries a few random jobs, then lists again
            rng.shuffle(jobs)
            for job in jobs[:tries]:
                if time.perf_counter() >= stop_at:
                    return
                status, data = await _call(reader, writer, "POST", f"{base}/job/{job['ID']}", claim)
                if status == 400:
                    counts["lost"] += 1
                    continue
                assert status == 202, (status, data)
                status, data = await _call(reader, writer, "POST", f"{base}/job/{job['ID']}", deliver)
                assert status == 202, (status, data)
                counts["jobs"] += 1
    finally:
        writer.close()


async def fast_client(url: str, stop_at: float, counts: dict, batch: int) -> None:
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    base = "/channel/bench/consumer/fast"
    pull = json.dumps({"batch": batch}).encode()
    try:
        while time.perf_counter() < stop_at:
            status, data = await _call(reader, writer, "POST", f"{base}/pull", pull)
            assert status == 200, (status, data)
            jobs = json.loads(data)["Result"]
            if not jobs:
                return
            ack = json.dumps({"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}).encode()
            status, data = await _call(reader, writer, "POST", f"{base}/ack", ack)
            assert status == 200, (status, data)
            counts["jobs"] += len(jobs)
    finally:
        writer.close()


# --baseline: the spec path as it was before the pull fast lane and asynchronous spec-path commits
BASELINE_ENV = {"BROKER_FAST_LANE": "0", "BROKER_PULL_ASYNC_COMMIT": "0"}


def spec_phase(server, db_pid: int | None, clients: int, seconds: float) -> tuple[float, dict, Cpu]:
    """The spec path against ``server`` for ``seconds``: 1 client lists 25 and works through them,
    more clients list 100 and each tries 10 at random. Returns (jobs/s, counts, CPU)."""
    url = server.url
    with Cpu(server.popen.pid, db_pid) as cpu:
        if clients == 1:
            rate, counts = run_http(lambda stop, counts: [spec_client(url, stop, counts, 0)], seconds)
        else:
            rate, counts = run_http(lambda stop, counts: [spec_client(url, stop, counts, i, page=100, tries=10)
                                                          for i in range(clients)], seconds)
    return rate, counts, cpu


def run_http(make_clients, seconds: float) -> tuple[float, dict]:
    counts = {"jobs": 0, "lost": 0}

    async def main():
        stop_at = time.perf_counter() + seconds
        t0 = time.perf_counter()
        await asyncio.gather(*make_clients(stop_at, counts))
        return time.perf_counter() - t0

    elapsed = asyncio.run(main())
    return counts["jobs"] / elapsed, counts


# --- the Python client (client/, broker_client): consume() with batch 100, one process per client ---------

def _client_worker(url: str, batch: int, stop_at: float, out) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))  # when not pip-installed
    from broker_client import PullConsumer

    consumer = PullConsumer(url, "bench", "client", "ct", "t")
    done, last = [0], [time.time()]

    def handler(job) -> None:
        done[0] += 1
        last[0] = time.time()

    def watch() -> None:  # stop at the cap, or once the backlog is gone (no job for 3 s)
        while time.time() < stop_at and time.time() - last[0] < 3.0:
            time.sleep(0.05)
        consumer.stop()

    start = time.time()
    threading.Thread(target=watch, daemon=True).start()
    consumer.consume(handler, batch=batch, expires=1, signals=())
    out.put((done[0], start, last[0]))


def run_client(url: str, clients: int, batch: int, seconds: float) -> tuple[float, int]:
    """consume() in ``clients`` processes; jobs/s from the first start to the last handled job."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop_at = time.time() + seconds
    procs = [ctx.Process(target=_client_worker, args=(url, batch, stop_at, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    total = sum(r[0] for r in results)
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    return total / max(elapsed, 1e-9), total


# --- the raw limit: the same claim and ack straight in SQL ---------------------------------------------

RAW_CLAIM = """
WITH c AS (
    SELECT id FROM jobs_job
     WHERE consumer_id = %(consumer)s AND status = 1001 AND next_attempt_at <= now()
     ORDER BY priority DESC, id LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = 1002, status_changed_at = now(), deadline = now() + interval '32 seconds'
      FROM c WHERE j.id = c.id
    RETURNING j.id, j.message_id
)
SELECT u.id, m.message_id, m.payload FROM u JOIN broker_message m ON m.id = u.message_id
"""
RAW_ACK = "UPDATE jobs_job SET status = 1003, status_changed_at = now(), deadline = NULL " \
          "WHERE id = ANY(%(ids)s) AND status = 1002 AND consumer_id = %(consumer)s"


def _raw_worker(database_url: str, consumer: int, batch: int, stop_at: float, out) -> None:
    done = 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.time() < stop_at:
            rows = conn.execute(RAW_CLAIM, {"consumer": consumer, "batch": batch}).fetchall()
            if not rows:
                break
            conn.execute(RAW_ACK, {"ids": [r[0] for r in rows], "consumer": consumer})
            done += len(rows)
    out.put(done)


def run_raw(database_url: str, clients: int, batch: int, seconds: float) -> tuple[float, int]:
    with psycopg.connect(database_url) as conn:
        consumer = conn.execute("SELECT id FROM consumers_consumer WHERE consumer_id = 'raw'").fetchone()[0]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    t0 = time.perf_counter()
    stop_at = time.time() + seconds
    procs = [ctx.Process(target=_raw_worker, args=(database_url, consumer, batch, stop_at, out))
             for _ in range(clients)]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return total / elapsed, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes_add(parser, backlog=200_000, clients=4, batch=100, spec_seconds=10.0, spec_clients=8,
              seconds=(60.0, "cap per fast/raw phase"), workers=2)
    parser.add_argument("--baseline", action="store_true",
                        help="also measure the spec path without the pull fast lane and with durable commits")
    # --smoke: fast and raw end when the tiny backlog is drained; 15 s only covers slow process start-up
    args = smoke_args_parse(parser, backlog=400, clients=2, spec_seconds=1.0, spec_clients=2, seconds=15.0)
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with broker_database() as database_url:
        env = base_env(database_url)
        manage(env, "migrate", "--verbosity", "0")
        from bench.growth import Compactor, django_setup

        django_setup(env)
        compactor = Compactor()  # the workers' counter compaction (every 5 s)
        compactor.start()
        server = start_gunicorn(env, workers=args.workers)
        baseline = start_gunicorn({**env, **BASELINE_ENV}, workers=args.workers) if args.baseline else None
        try:
            setup(server.url)
            t0 = time.perf_counter()
            backlog(database_url, args.backlog)
            print(f"backlog: {args.backlog} jobs for each of {len(CONSUMERS)} pull consumers "
                  f"({time.perf_counter() - t0:.0f} s to insert)", flush=True)
            url = server.url
            web_pid, db_pid = server.popen.pid, postmaster_pid(database_url)
            for warm in (server, baseline):  # each worker's first requests import and connect
                if warm:
                    run_http(lambda stop, counts, u=warm.url: [spec_client(u, stop, counts, i) for i in range(2)],
                             min(1.0, args.spec_seconds / 4))
            base_rows = []
            if baseline:  # alternating with the default server's phases: same conditions
                base_rows.append(spec_phase(baseline, db_pid, 1, args.spec_seconds))
            spec1, c1, cpu1 = spec_phase(server, db_pid, 1, args.spec_seconds)
            if baseline:
                base_rows.append(spec_phase(baseline, db_pid, args.spec_clients, args.spec_seconds))
            specn, cn, cpun = spec_phase(server, db_pid, args.spec_clients, args.spec_seconds)
            with psycopg.connect(database_url, autocommit=True) as conn:
                vacuum(conn)
            with Cpu(web_pid, db_pid) as cpuf:
                fast, cf = run_http(lambda stop, counts: [fast_client(url, stop, counts, args.batch)
                                                          for _ in range(args.clients)], args.seconds)
            with psycopg.connect(database_url, autocommit=True) as conn:
                vacuum(conn)
            with Cpu(web_pid, db_pid) as cpuc:
                client, client_jobs = run_client(url, args.clients, args.batch, args.seconds)
            with psycopg.connect(database_url, autocommit=True) as conn:
                vacuum(conn)
            with Cpu(None, db_pid) as cpur:
                raw, raw_jobs = run_raw(database_url, args.clients, args.batch, args.seconds)
        finally:
            server.stop()
            if baseline:
                baseline.stop()
            compactor.stop.set()
            compactor.join()
    print(f"pull benchmark: gunicorn {args.workers} workers, {len(PAYLOAD)}-byte JSON payloads, "
          f"backlog {args.backlog} jobs per consumer, load average before: {load_before}")
    print(f"{'path':66} {'jobs/s':>8} {'vs raw':>7}   CPU ms/job: web + db + client")
    rows = [
        ("spec: queued-jobs + INFLIGHT + DELIVERED, 1 client", spec1, cpu1, c1["jobs"], ""),
        (f"spec: same, {args.spec_clients} clients (limit 100, each tries 10 at random)", specn, cpun, cn["jobs"],
         f", {cn['lost']} lost claim races"),
        (f"fast: pull + ack, batch {args.batch}, {args.clients} clients", fast, cpuf, cf["jobs"], ""),
        (f"raw SQL claim + ack (SKIP LOCKED), batch {args.batch}, {args.clients} clients", raw, cpur, raw_jobs, ""),
        (f"client: broker_client consume(), batch {args.batch}, {args.clients} processes", client, cpuc, client_jobs,
         f", {client / fast:.2f} of fast, target >= 0.80: {'met' if client >= 0.8 * fast else 'NOT met'}"),
    ]
    if base_rows:
        (b1, bc1, bcpu1), (bn, bcn, bcpun) = base_rows
        rows[2:2] = [
            ("spec baseline (no fast lane, durable commits), 1 client", b1, bcpu1, bc1["jobs"],
             f", default / baseline: {spec1 / max(b1, 1e-9):.2f}"),
            (f"spec baseline, {args.spec_clients} clients", bn, bcpun, bcn["jobs"],
             f", {bcn['lost']} lost claim races, default / baseline: {specn / max(bn, 1e-9):.2f}"),
        ]
    for name, rate, cpu, jobs, extra in rows:
        print(f"{name:66} {rate:8.0f} {rate / raw:7.3f}   {cpu.per_job(jobs)}  ({jobs} jobs{extra})")
    print(f"targets: fast >= raw / 2 ({raw / 2:.0f}/s): {'met' if fast >= raw / 2 else 'NOT met'} "
          f"({fast / raw:.2f}); spec >= 500/s with 1 client: {'met' if spec1 >= 500 else 'NOT met'}; "
          f"spec >= 1,000/s with {args.spec_clients}: {'met' if specn >= 1000 else 'NOT met'}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")

if __name__ == "__main__":
    main()
