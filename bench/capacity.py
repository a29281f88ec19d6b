"""Capacity and cost per message: single publishes at fixed rates to one push and one pull consumer.

    .venv/bin/python bench/capacity.py                              # rates 300,600,1000, 60 s each
    .venv/bin/python bench/capacity.py --rates 1000 --seconds 300   # issue 28's capacity run
    .venv/bin/python bench/capacity.py --rates 300 --idle 60        # cost per message and at rest
    .venv/bin/python bench/capacity.py --rates 1000 --event-schema  # issue 37: publishes validated
    DATABASE_URL=postgres://... .venv/bin/python bench/capacity.py  # an existing (migrated here) database

Everything runs on this machine as a user runs it: PostgreSQL (a throw-away embedded server, fsync
on), gunicorn and qcluster as `make run` starts them, a push receiver answering 204 at once (its own
process) and the load generator (its own process). One channel with one push consumer
(``maxInFlight`` 50) and one pull consumer that pulls batches of up to 500 (long-polling 5 s) and
acks them with their ``Receipt``.

The load is open-loop: a ticker hands out one publish slot every 1/rate s to ``--connections``
keep-alive connections; a slot waits when every connection is busy, and its latency counts from
its slot time (no coordinated omission). Each publish carries its sequence number and send time
(``X-Seq`` and ``X-Sent-At`` metadata headers, and in the JSON body), so lost and duplicated
deliveries are counted per consumer, and publish-to-callback / publish-to-pull latencies measured.

Printed per rate: the achieved rate, publish p50/p99, callback and pull p50/p99, lost and
duplicated, CPU milliseconds per message of PostgreSQL (the postmaster and all its children, from
/proc), web (gunicorn's process group), workers (qcluster's) and the load generator, and commits
per message (pg_stat_database). First an idle figure: the same processes' CPU over ``--idle``
seconds with no traffic (the pull consumer long-polling), as a share of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import _read_response, build_request, percentile, smoke_args_parse, smoke_problems_exit  # noqa: E402
from bench.common import EVENT_SCHEMA, EVENT_TYPE, event_payload  # noqa: E402  (issue 37: --event-schema)
from bench.push import PUBLISH_HEADERS, Broker, Receiver, _stat, cpu_by_group  # noqa: E402

SMOKE_TABLE = (r"^idle +[\d.]+ s: .* total [\d.]+ % of one core; .*\n(?s:.*)"
               r"^rate +\d+/s: achieved [\d.]+/s .* publish p50/p99 .* lost \d+ dup \d+ .*\n"
               r" +CPU ms/msg: postgres [\d.]+, .* commits/msg [\d.]+")
CHANNEL, PUSHER, PULLER = "capacity", "pusher", "puller"
CHANNEL_TOKEN, PULL_TOKEN = "bench-c", "pull-token"
PAD = "x" * 200  # bodies of ~250 bytes


# --- the load generator (its own process) ---------------------------------------------------------

def _load_main(url: str, connections: int, pull_batch: int, conn, event_payloads: bool = False) -> None:
    """Publisher and puller on one asyncio loop; commands come over ``conn``."""
    host, port = url.split("//")[1].split(":")
    port = int(port)
    pulled: list[int] = []
    pull_lat: list[float] = []
    pull_errors = [0]

    async def puller() -> None:
        base = f"/channel/{CHANNEL}/consumer/{PULLER}"
        headers = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": PULL_TOKEN,
                   "Content-Type": "application/json"}
        pull = json.dumps({"batch": pull_batch, "expires": 5}).encode()
        reader = writer = None
        while True:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                writer.write(build_request("POST", f"{base}/pull", headers, pull))
                status, _, body = await _read_response(reader)
                now = time.time()
                if status != 200:
                    pull_errors[0] += 1
                    await asyncio.sleep(0.2)
                    continue
                jobs = json.loads(body)["Result"]
                if not jobs:
                    continue
                for job in jobs:
                    payload = json.loads(job["Message"]["Payload"])
                    pulled.append(payload["i"])
                    pull_lat.append(now - payload["t"])
                ack = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED", "Receipt": j["Receipt"]} for j in jobs]}
                writer.write(build_request("POST", f"{base}/ack", headers, json.dumps(ack).encode()))
                status, _, body = await _read_response(reader)
                results = json.loads(body).get("Result", []) if status == 200 else []
                pull_errors[0] += (status != 200) + sum(1 for r in results if r.get("Error"))
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, KeyError):
                pull_errors[0] += 1
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.2)

    async def publish(rate: float, seconds: float, first: int) -> dict:
        """Open-loop single publishes at ``rate`` for ``seconds``; sequence numbers from ``first``."""
        queue: asyncio.Queue = asyncio.Queue()
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        ok: list[int] = []
        path = f"/channel/{CHANNEL}/broadcast"

        async def ticker() -> None:
            start = time.perf_counter()
            wall = time.time() - start
            for n in range(int(rate * seconds)):
                due = start + n / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                queue.put_nowait((first + n, due, wall + due))
            for _ in range(connections):
                queue.put_nowait(None)

        async def sender() -> None:
            reader = writer = None
            while (item := await queue.get()) is not None:
                seq, due, sent = item
                body = json.dumps({"i": seq, "t": sent, "pad": PAD}).encode()
                headers = {**PUBLISH_HEADERS, "Content-Type": "application/json",
                           "X-Broker-Metadata-Headers": "X-Sent-At,X-Seq", "X-Sent-At": repr(sent), "X-Seq": str(seq)}
                if event_payloads:  # issue 37: the 20-property payload of EVENT_SCHEMA, typed
                    body = json.dumps(event_payload(seq, sent, PAD)).encode()
                    headers["X-Broker-Message-Type"] = EVENT_TYPE
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(host, port)
                    writer.write(build_request("POST", path, headers, body))
                    status, _, _ = await asyncio.wait_for(_read_response(reader), 60)
                except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                latencies.append(time.perf_counter() - due)
                statuses[status] = statuses.get(status, 0) + 1
                if status == 201:
                    ok.append(seq)
            if writer is not None:
                writer.close()

        started = time.perf_counter()
        await asyncio.gather(ticker(), *(sender() for _ in range(connections)))
        return {"seconds": time.perf_counter() - started, "latencies": latencies, "statuses": statuses, "ok": ok}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulling = loop.create_task(puller())
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd[0] == "publish":
                conn.send(await publish(*cmd[1:]))
            elif cmd[0] == "pulled":
                conn.send((list(pulled), list(pull_lat), pull_errors[0]))
                pulled.clear()
                pull_lat.clear()
            elif cmd[0] == "stop":
                pulling.cancel()
                conn.send(True)
                return

    asyncio.run(main())


class Load:
    def __init__(self, url: str, connections: int, pull_batch: int, event_payloads: bool = False) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_load_main, args=(url, connections, pull_batch, child, event_payloads),
                                            daemon=True)
        self.proc.start()

    def ask(self, *cmd):
        self.conn.send(cmd)
        return self.conn.recv()

    def stop(self) -> None:
        try:
            self.ask("stop")
        except (OSError, EOFError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


# --- measurements ---------------------------------------------------------------------------------

class Database:
    """The broker's database, watched: commits so far, and the postmaster's pid (for its CPU)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        backend = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with open(f"/proc/{backend}/stat") as fh:
            self.postmaster = int(fh.read().rsplit(")", 1)[1].split()[1])

    def statements_reset(self) -> bool:
        """Start counting statements (pg_stat_statements); False when the server does not load it."""
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.conn.execute("SELECT pg_stat_statements_reset()")
            return True
        except Exception:  # noqa: BLE001 - not in shared_preload_libraries: no statement figures
            return False

    def statements_print(self, per: float, label: str, top: int = 15) -> None:
        """The statements run since the reset, most total time first: calls per ``label``, mean ms."""
        rows = self.conn.execute(
            "SELECT calls, total_exec_time, plans, total_plan_time, regexp_replace(left(query, 90), '\\s+', ' ', 'g')"
            "  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time + total_plan_time DESC LIMIT %s", [top]).fetchall()
        for calls, total, plans, planning, query in rows:
            print(f"    {calls / per:8.2f} calls/{label} {total / max(1, calls):7.3f} ms"
                  + (f" (+{plans / per:.2f} plans {planning / plans:.3f} ms)" if plans else "") + f"  {query}", flush=True)

    def backends(self) -> dict[int, float]:
        """CPU seconds so far of each of the server's processes: {pid: seconds}."""
        out = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit() and (st := _stat(pid)) is not None and st[0] == self.postmaster:
                out[int(pid)] = st[2]
        return out

    def backends_print(self, before: dict[int, float], per: float, label: str, total: float) -> None:
        """The server's CPU since ``before`` by what its processes are (application_name, else the
        backend type): where a message's database time goes besides its statements."""
        after = self.backends()
        kinds = dict(self.conn.execute(
            "SELECT pid, CASE WHEN application_name <> '' THEN application_name ELSE backend_type END"
            "  FROM pg_stat_activity").fetchall())
        by: dict[str, float] = {}
        for pid, cpu in after.items():
            kind = kinds.get(pid, "(not in pg_stat_activity)")
            by[kind] = by.get(kind, 0.0) + cpu - before.get(pid, 0.0)
        by["(ended since)"] = total - sum(by.values())
        print("    postgres CPU by process, ms/" + label + ": " + ", ".join(
            f"{kind} {1000 * cpu / per:.3f}" for kind, cpu in sorted(by.items(), key=lambda kv: -kv[1])
            if abs(cpu) >= 0.00005 * per), flush=True)

    def commits(self) -> tuple[int, int]:
        """(commits, sessions opened) so far."""
        return self.conn.execute(
            "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()


def groups(broker: Broker, database: Database, load: Load) -> dict:
    return {"postgres": ("children", database.postmaster), "web": ("pgrp", broker.web.pid),
            "workers": ("pgrp", broker.workers.pid), "load": ("children", load.proc.pid)}


def idle(broker: Broker, database: Database, load: Load, seconds: float, *, statements: bool = False) -> dict:
    """CPU share of one core of each group over ``seconds`` with no traffic."""
    g = groups(broker, database, load)
    counting = database.statements_reset() if statements else False
    before, t0, commits0, backends0 = cpu_by_group(g), time.monotonic(), database.commits(), database.backends()
    time.sleep(seconds)
    after, wall, commits1 = cpu_by_group(g), time.monotonic() - t0, database.commits()
    share = {name: 100.0 * (after[name] - before[name]) / wall for name in g}
    line = (f"idle {wall:5.1f} s: " + ", ".join(f"{name} {share[name]:.2f} %" for name in g)
            + f"; broker total {sum(v for k, v in share.items() if k != 'load'):.2f} % of one core; "
            f"{(commits1[0] - commits0[0]) / wall:.1f} commits/s, {commits1[1] - commits0[1]} new connections")
    print(line, flush=True)
    if counting:
        database.statements_print(wall, "s")
        database.backends_print(backends0, wall, "s", after["postgres"] - before["postgres"])
    return share


def rate_run(broker: Broker, receiver: Receiver, database: Database, load: Load, *, rate: float, seconds: float,
             first: int, drain: float, statements: bool = False) -> dict:
    """One rate: publish, wait for every delivery (up to ``drain`` s), count and print."""
    g = groups(broker, database, load)
    receiver.ask("reset")
    load.ask("pulled")  # clear
    counting = database.statements_reset() if statements else False
    cpu0, commits0, backends0 = cpu_by_group(g), database.commits(), database.backends()
    result = load.ask("publish", rate, seconds, first)
    cpu1, commits1 = cpu_by_group(g), database.commits()
    ok = set(result["ok"])
    deadline = time.monotonic() + drain
    pushed, pulled, pull_lat, pull_errors = [], [], [], 0
    while True:
        pushed = receiver.ask("seqs")
        got, lat, errors = load.ask("pulled")
        pulled += got
        pull_lat += lat
        pull_errors += errors
        if (ok <= set(pushed) and ok <= set(pulled)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    _, _, _, push_lat = receiver.ask("stats")
    n = max(1, len(ok))
    cpu = {name: 1000.0 * (cpu1[name] - cpu0[name]) / n for name in g}
    out = {
        "rate": rate, "achieved": len(ok) / result["seconds"], "published": len(ok),
        "failed": sum(v for k, v in result["statuses"].items() if k != 201), "statuses": result["statuses"],
        "publish": [1000 * percentile(result["latencies"], p) for p in (50, 99)],
        "callback": [1000 * percentile(push_lat, p) for p in (50, 99)],
        "pull": [1000 * percentile(pull_lat, p) for p in (50, 99)],
        "lost": len(ok - set(pushed)) + len(ok - set(pulled)),
        "dup": (len(pushed) - len(set(pushed))) + (len(pulled) - len(set(pulled))),
        "pull_errors": pull_errors, "cpu": cpu, "commits": (commits1[0] - commits0[0]) / n,
        "connections": commits1[1] - commits0[1],
    }
    print(f"rate {rate:5.0f}/s: achieved {out['achieved']:.1f}/s ({out['published']} published, {out['failed']} "
          f"failed {out['statuses']}) | publish p50/p99 {out['publish'][0]:.1f}/{out['publish'][1]:.1f} ms | "
          f"callback p50/p99 {out['callback'][0]:.0f}/{out['callback'][1]:.0f} ms | pull p50/p99 "
          f"{out['pull'][0]:.0f}/{out['pull'][1]:.0f} ms | lost {out['lost']} dup {out['dup']} "
          f"(pull/ack errors {pull_errors})", flush=True)
    print("          CPU ms/msg: " + ", ".join(f"{name} {ms:.2f}" for name, ms in cpu.items())
          + f"; broker {cpu['web'] + cpu['workers']:.2f}; commits/msg {out['commits']:.2f}; "
          f"{out['connections']} new database connections", flush=True)
    if counting:
        database.statements_print(n, "msg")
        database.backends_print(backends0, n, "msg", cpu1["postgres"] - cpu0["postgres"])
    return out


def channel_create(broker: Broker, receiver_port: int, max_in_flight: int) -> None:
    s = broker.session
    r = s.put(f"{broker.url}/channel/{CHANNEL}", data={"token": CHANNEL_TOKEN})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/{PUSHER}",
              data={"token": "t0", "callbackUrl": f"http://127.0.0.1:{receiver_port}/{CHANNEL}/{PUSHER}",
                    "maxInFlight": str(max_in_flight)})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/{PULLER}", data={"token": PULL_TOKEN, "type": "pull"})
    assert r.status_code == 200, r.text


def event_schema_put(broker: Broker) -> None:
    """Issue 37: EVENT_SCHEMA (20 properties) as the channel's event type EVENT_TYPE: every publish
    is validated against it in the web process."""
    r = broker.session.put(f"{broker.url}/channel/{CHANNEL}/event-type/{EVENT_TYPE}", json={"schema": EVENT_SCHEMA})
    assert r.status_code == 200, r.text
    print(f"event schema: {EVENT_TYPE}, 20 properties, every publish of that type validated", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="300,600,1000", help="publishes per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load per rate")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle figure (0: none)")
    parser.add_argument("--connections", type=int, default=64, help="the publisher's keep-alive connections")
    parser.add_argument("--pull-batch", type=int, default=500)
    parser.add_argument("--max-in-flight", type=int, default=50)
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait for the last deliveries")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--server", choices=("gunicorn", "granian"), default="gunicorn",
                        help="the web server (granian: pip install granian; for a side-by-side comparison)")
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    parser.add_argument("--statements", action="store_true",
                        help="print the top statements of each phase (pg_stat_statements: loaded into the "
                             "embedded server; an existing server must have it in shared_preload_libraries)")
    parser.add_argument("--event-schema", action="store_true",
                        help="issue 37: a 20-property schema on the channel (bench/common.py EVENT_SCHEMA) and "
                             "publishes of its type that validate (implies --event-payload)")
    parser.add_argument("--event-payload", action="store_true",
                        help="the same typed 20-property payloads without the schema (the like-for-like baseline)")
    args = smoke_args_parse(parser, rates="20", seconds=3.0, idle=2.0, connections=4, drain=20.0)

    if args.statements and not os.environ.get("DATABASE_URL"):
        os.environ["BROKER_EMBEDDED_PG_OPTIONS"] = (os.environ.get("BROKER_EMBEDDED_PG_OPTIONS", "")
                                                    + " -c shared_preload_libraries=pg_stat_statements"
                                                    " -c pg_stat_statements.track_planning=on")
    workdir = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    receiver = Receiver()
    broker = Broker(args, workdir)
    load = database = None
    problems: list[str] = []
    try:
        channel_create(broker, receiver.port, args.max_in_flight)
        if args.event_schema:
            event_schema_put(broker)
        database = Database(broker.env["DATABASE_URL"])
        load = Load(broker.url, args.connections, args.pull_batch, args.event_schema or args.event_payload)
        print(f"capacity: {os.cpu_count()} CPUs, 1 push consumer (maxInFlight {args.max_in_flight}) + 1 pull consumer "
              f"(batch {args.pull_batch}, Receipt acks), {args.connections} publisher connections, "
              f"{args.web_workers} web workers; logs in {workdir}", flush=True)
        time.sleep(3.0)  # dispatcher loops start, the puller's first long poll
        if args.idle > 0:
            idle(broker, database, load, args.idle, statements=args.statements)
        first = 0
        for rate in [float(x) for x in args.rates.split(",") if x.strip()]:
            out = rate_run(broker, receiver, database, load, rate=rate, seconds=args.seconds, first=first,
                           drain=args.drain, statements=args.statements)
            first += int(rate * args.seconds)
            problems += [f"rate {rate:.0f}: {n} {what}" for n, what in (
                (out["failed"], "failed publishes"), (out["lost"], "lost deliveries"),
                (out["pull_errors"], "pull/ack errors")) if n]
            if not out["published"]:
                problems.append(f"rate {rate:.0f}: nothing published")
    finally:
        if load is not None:
            load.stop()
        broker.stop()
        receiver.stop()
    smoke_problems_exit(problems=problems)  # failed publishes, lost deliveries: exit 1, at any size


if __name__ == "__main__":
    main()
