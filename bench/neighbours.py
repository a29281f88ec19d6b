"""Good neighbours: what a long reader, dead endpoints and the Spark report cost everyone else.

    .venv/bin/python bench/neighbours.py                              # every case, the issue's lengths (~40 min)
    .venv/bin/python bench/neighbours.py --cases hold --hold 600      # a REPEATABLE READ snapshot held 10 min
    .venv/bin/python bench/neighbours.py --cases dead --dead-seconds 120
    .venv/bin/python bench/neighbours.py --cases report               # the Spark report against the live database
    DATABASE_URL=postgres://... .venv/bin/python bench/neighbours.py  # an existing (migrated here) database

The broker as a user runs it (bench/capacity.py's pieces: PostgreSQL, gunicorn, qcluster, a push
receiver answering 204 and the open-loop load generator, each in its own process) gets
``--rate`` single publishes a second (300) on one channel with one push consumer (``maxInFlight``
50) and one pull consumer (batches of 500, acked with their ``Receipt``): the *healthy* traffic.
After a warm-up, a baseline phase, then each case in turn (by default the dead endpoints, the report,
then the hold, whose backlog takes longest to drain), each with its own phases; between two cases
the broker gets up to ``--settle`` seconds to be back at its baseline (10-second slices, not
measured, until one's callbacks and pulls are within 1.5x of the baseline's p99):

- ``hold``: a connection BEGINs ISOLATION LEVEL REPEATABLE READ, reads from jobs_job and
  broker_message and sits idle in transaction for ``--hold`` seconds (as a long report or an
  analyst's notebook does); phases: during the hold, then ``--after`` seconds after its release.
- ``dead``: a second channel gets ``--dead-rate`` messages a second (published in batches of
  ``--dead-batch``, so the web tier's share stays near the baseline's and what is measured is the
  dispatcher) for two push consumers whose endpoints are dead: one never answers (``maxInFlight``
  500), one answers 500 at once (``--fail-mode refuse``: refuses connections); phases: the first
  minute, then the rest of ``--dead-seconds``. Prints how many connections each dead endpoint saw
  (and in its busiest second), and the consumers' circuits.
- ``report``: ``manage.py pipeline report`` (Spark over JDBC) against the live database, as an
  operator runs it; phases: while it runs, then ``--after`` seconds. Skipped with a line saying so
  when Java or pyspark is missing (and in ``--smoke`` unless asked for with ``--cases``).

Per phase: the healthy traffic's achieved rate, CPU milliseconds per message (every message
published in the phase, both channels) of PostgreSQL (all its processes, from /proc), web
(gunicorn's process group), workers (qcluster's) and the load generators; publish-to-callback and
publish-to-pull p50/p99 of the messages published in the phase, and the worst 10-second slice (the
highest latency of the messages published in any 10 s of it); dead tuples of all tables
(pg_stat_all_tables) at its end and the database's growth per second. Then, per phase, the ratios
to the baseline, with PASS (at most 1.5x) or FAIL for the figures the issue ("Good neighbours")
bounds in that case: PostgreSQL CPU per message, callback and pull p99 and growth per second for
the hold and the report (and the phases after them), the healthy consumer's callback p99 for the
dead endpoints (whose channel adds messages and data by design); and a verdict per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.capacity import Database, Load, broker_start, groups  # noqa: E402
from bench.common import (build_request, parts_stop, percentile, receiver_serve, run_load,  # noqa: E402
                          smoke_args_parse, smoke_problems_exit)
from bench.push import PUBLISH_HEADERS, Broker, Receiver, _kill, cpu_by_group  # noqa: E402

SMOKE_TABLE = (r"^phase +baseline .* callback p50/p99 [\d.]+/[\d.]+ ms\b.*$"  # then both cases, in either order
               r"(?=(?s:.*)^phase +hold .*\n +vs baseline: .*verdict (PASS|FAIL))"
               r"(?=(?s:.*)^phase +dead.* callback p50/p99 .*\n +vs baseline: .*verdict (PASS|FAIL))")
LIMIT = 1.5  # the bound: every figure within 1.5x of the same run's baseline
SLICE = 10.0  # seconds: the worst slice's length
DEAD_CHANNEL = "neighbours-dead"


# --- the dead endpoints (one process each) ----------------------------------------------------

def _dead_main(mode: str, port: int, conn) -> None:
    """``hang``: accept, read, never answer; ``fail``: answer 500 at once. Counts connections (with
    the time each opened) and requests for the report."""
    opened: list[float] = []
    requests = [0]
    failure = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
    kept = []

    def connected(transport) -> None:
        opened.append(time.time())
        kept.append(transport)

    def answer(head: bytes, body: bytes) -> bytes | None:
        requests[0] += 1
        return failure if mode == "fail" else None

    def control():
        while True:
            cmd = conn.recv()
            if cmd == "stats":
                conn.send((list(opened), requests[0]))

    receiver_serve(port, conn, control, answer, connected=connected, backlog=4096)


class DeadEndpoint:
    """A loopback endpoint that never answers (``hang``), answers 500 (``fail``) or refuses
    connections (``refuse``: a port nobody listens on)."""

    def __init__(self, mode: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.mode = mode
        self.proc = None
        if mode != "refuse":
            self.conn, child = multiprocessing.Pipe()
            self.proc = multiprocessing.Process(target=_dead_main, args=(mode, self.port, child), daemon=True)
            self.proc.start()
            assert self.conn.recv() == "ready"

    def stats(self) -> tuple[list[float], int]:
        if self.proc is None:
            return [], 0
        self.conn.send("stats")
        return self.conn.recv()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def _feed_main(url: str, rate: float, batch: int, seconds: float, conn) -> None:
    """The dead channel's load: ``rate`` messages a second in batch publishes, for ``seconds``."""
    body = json.dumps([{"Payload": json.dumps({"pad": "x" * 200}), "ContentType": "application/json"}] * batch).encode()
    request = build_request("POST", f"/channel/{DEAD_CHANNEL}/messages",
                            {**PUBLISH_HEADERS, "Content-Type": "application/json"}, body)
    total = max(1, int(rate * seconds / batch))
    _, statuses, _ = asyncio.run(run_load(url, lambda i: request, total, min(8, total), rate=rate / batch))
    conn.send({"messages": statuses.get(201, 0) * batch, "statuses": statuses, "cpu": time.process_time()})


class Feeder:
    def __init__(self, url: str, rate: float, batch: int, seconds: float) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_feed_main, args=(url, rate, batch, seconds, child), daemon=True)
        self.proc.start()

    def result(self) -> dict:
        out = self.conn.recv()
        self.proc.join(5)
        return out


# --- a long reader ------------------------------------------------------------------------------

class Snapshot:
    """A REPEATABLE READ transaction that read from jobs_job and broker_message and sits idle."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name="bench-neighbours-snapshot")
        self.conn.execute("SET idle_in_transaction_session_timeout = 0")
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]

    def begin(self) -> None:
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.conn.execute("SELECT count(*) FROM (SELECT 1 FROM jobs_job LIMIT 1000) j")
        self.conn.execute("SELECT count(*) FROM (SELECT 1 FROM broker_message LIMIT 1000) m")

    def release(self, database: Database) -> str:
        """End it; says how old its snapshot was (the server's view) just before."""
        age = database.conn.execute("SELECT age(backend_xmin), now() - xact_start, state FROM pg_stat_activity "
                                    "WHERE pid = %s", [self.pid]).fetchone()
        self.conn.execute("COMMIT")
        self.conn.close()
        if age is None:
            return "the snapshot's connection was gone before its release"
        return f"held {age[1].total_seconds():.0f} s ({age[2]}), its xmin {age[0]} transactions behind at the release"


# --- the Spark report ---------------------------------------------------------------------------

def spark_missing() -> str | None:
    """Why the report cannot run here (the command would say the same and exit 2), or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Java is not installed"
    jar = os.environ.get("BROKER_JDBC_JAR", "/usr/share/java/postgresql.jar")
    if not os.path.exists(jar):
        return f"the PostgreSQL JDBC jar is missing at {jar}"
    return None


def report_start(broker: Broker, workdir: Path) -> subprocess.Popen:
    out = workdir / "report"
    env = {**broker.env, "BROKER_PIPELINE_DIR": str(workdir / "pipeline")}
    return subprocess.Popen([sys.executable, "manage.py", "pipeline", "report", "--since", "1d", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=open(workdir / "report.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


# --- phases -------------------------------------------------------------------------------------

@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    first: int = 0  # the healthy traffic's sequence numbers [first, first + sent)
    sent: int = 0
    wall: float = 0.0  # wall time of its first publish slot
    rate: float = 0.0
    published: int = 0  # healthy publishes answered 201
    failed: int = 0
    other: int = 0  # messages published on the dead channel
    cpu: dict = field(default_factory=dict)  # ms per message by group
    dead_tuples: int = 0
    growth: float = 0.0  # MB/s
    callback: list = field(default_factory=list)  # [p50, p99, worst slice, its start s into the phase]
    pull: list = field(default_factory=list)
    slices: dict = field(default_factory=dict)  # {"callback"|"pull": [the highest latency of each 10 s, ms]}
    notes: list = field(default_factory=list)
    # the figures the issue bounds in this phase (PASS/FAIL); the others are shown as ratios only
    criteria: tuple = ("PostgreSQL CPU/msg", "callback p99", "pull p99", "growth/s")


def db_figures(database: Database) -> tuple[int, int]:
    """(database size in bytes, dead tuples of all tables)."""
    size = database.conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    dead = database.conn.execute("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_all_tables").fetchone()[0]
    return int(size), int(dead)


class Run:
    """The broker, the healthy traffic and what each phase measured."""

    def __init__(self, args, broker: Broker, receiver: Receiver, database: Database, load: Load) -> None:
        self.args, self.broker, self.receiver, self.database, self.load = args, broker, receiver, database, load
        self.first = 0
        self.phases: list[Phase] = []
        self.extra_groups: dict = {}
        self.pushed: dict[int, float] = {}
        self.pulled: dict[int, float] = {}
        self.pull_errors = 0
        self.ok: set[int] = set()

    def phase(self, name: str, seconds: float, *, feeder: Feeder | None = None, keep: bool = True) -> Phase:
        """Publish the healthy traffic for ``seconds`` and take the phase's CPU and database figures
        (``feeder``: the dead channel's load running beside it; ``keep`` False: a warm-up)."""
        g = {**groups(self.broker, self.database, self.load), **self.extra_groups}
        cpu0, (size0, _), t0 = cpu_by_group(g), db_figures(self.database), time.monotonic()
        p = Phase(name=name, seconds=seconds, first=self.first, wall=time.time(), rate=self.args.rate)
        result = self.load.ask("publish", self.args.rate, seconds, self.first)
        other = feeder.result() if feeder is not None else {"messages": 0, "statuses": {}, "cpu": None}
        cpu1, (size1, dead1), wall = cpu_by_group(g), db_figures(self.database), time.monotonic() - t0
        p.sent = int(self.args.rate * seconds)
        self.first += p.sent
        self.ok |= set(result["ok"])
        p.published, p.failed = len(result["ok"]), sum(v for k, v in result["statuses"].items() if k != 201)
        p.failed += sum(v for k, v in other["statuses"].items() if k not in (200, 201))
        p.other = other["messages"]
        n = max(1, p.published + p.other)
        p.cpu = {name: 1000.0 * (cpu1[name] - cpu0[name]) / n for name in g}
        if other["cpu"] is not None:  # the dead channel's load generator (a process of the phase's own)
            p.cpu["dead load"] = 1000.0 * other["cpu"] / n
        p.dead_tuples, p.growth = dead1, (size1 - size0) / 1e6 / wall
        p.rate = p.published / result["seconds"]
        if keep:
            self.phases.append(p)
        self.collect()
        return p

    def collect(self) -> None:
        """Deliveries so far, by sequence number (the receiver and the puller keep their own lists)."""
        seqs = self.receiver.ask("seqs")
        _, _, _, lat = self.receiver.ask("stats")
        for seq, latency in zip(seqs, lat):
            self.pushed.setdefault(seq, latency)
        got, lat, errors = self.load.ask("pulled")
        for seq, latency in zip(got, lat):
            self.pulled.setdefault(seq, latency)
        self.pull_errors += errors

    def drain(self) -> int:
        """Wait (up to ``--drain`` s) for the healthy deliveries still due; returns how many are missing."""
        deadline = time.monotonic() + self.args.drain
        while True:
            self.collect()
            missing = len(self.ok - set(self.pushed)) + len(self.ok - set(self.pulled))
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.5)

    def settle(self, base: Phase, limit: float) -> str:
        """Publish the healthy traffic in 10-second slices (not measured) until a slice's callbacks
        and pulls all arrive within 1.5x of the baseline's p99 (the broker is back where it was), for
        at most ``limit`` seconds, so one case's after-effects (a backlog) do not count against the
        next; says how long it took."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            p = self.phase("settle", min(SLICE, limit), keep=False)
            time.sleep(1.0)
            self.collect()
            seqs = range(p.first, p.first + p.sent)
            if all(q in self.pushed and q in self.pulled for q in seqs):
                self.latencies(p)
                if p.callback[1] <= LIMIT * base.callback[1] and p.pull[1] <= LIMIT * base.pull[1]:
                    return f"settled after {time.monotonic() - started:.0f} s"
        return f"not settled within {limit:.0f} s"

    def latencies(self, p: Phase) -> None:
        """p50, p99 and the worst 10-second slice of the phase's messages (by publish time)."""
        for kind, seen in (("callback", self.pushed), ("pull", self.pulled)):
            values, slices = [], {}
            for seq in range(p.first, p.first + p.sent):
                if seq in seen:
                    values.append(seen[seq])
                    at = int((seq - p.first) / self.args.rate // SLICE)
                    slices[at] = max(slices.get(at, 0.0), seen[seq])
            worst = max(slices.items(), key=lambda kv: kv[1]) if slices else (0, float("nan"))
            p.slices[kind] = [1000 * slices[k] for k in sorted(slices)]
            setattr(p, kind, [1000 * percentile(values, 50), 1000 * percentile(values, 99), 1000 * worst[1],
                              worst[0] * SLICE])


def phase_print(p: Phase, base: Phase | None, *, show_slices: bool = False) -> None:
    cpu = ", ".join(f"{name} {ms:.2f}" for name, ms in p.cpu.items() if name != "postgres")
    print(f"phase {p.name:<18} {p.seconds:5.0f} s: {p.rate:6.1f}/s healthy"
          + (f" + {p.other / p.seconds:.0f}/s dead channel" if p.other else "")
          + f" | PostgreSQL {p.cpu['postgres']:.2f} ms/msg ({cpu})"
          + f" | callback p50/p99 {p.callback[0]:.0f}/{p.callback[1]:.0f} ms, worst 10 s {p.callback[2]:.0f} ms"
          + f" (+{p.callback[3]:.0f} s)"
          + f" | pull p50/p99 {p.pull[0]:.0f}/{p.pull[1]:.0f} ms, worst 10 s {p.pull[2]:.0f} ms (+{p.pull[3]:.0f} s)"
          + f" | dead tuples {p.dead_tuples / 1000:.1f}k | growth {p.growth:.2f} MB/s", flush=True)
    if base is not None and base is not p:
        print("    vs baseline: " + ", ".join(ratios(p, base)), flush=True)
    if show_slices:
        for kind, values in p.slices.items():
            print(f"    {kind} worst per 10 s, ms: " + " ".join(f"{v:.0f}" for v in values), flush=True)
    for note in p.notes:
        print(f"    {note}", flush=True)


def ratios(p: Phase, base: Phase) -> list[str]:
    """Each figure over the baseline's; PASS at most ``LIMIT`` for the phase's criteria."""
    checks = [("PostgreSQL CPU/msg", p.cpu["postgres"], base.cpu["postgres"]),
              ("callback p99", p.callback[1], base.callback[1]),
              ("callback worst 10 s", p.callback[2], base.callback[2]),
              ("pull p99", p.pull[1], base.pull[1]),
              ("dead tuples", p.dead_tuples, base.dead_tuples),
              ("growth/s", p.growth, base.growth)]
    parts, failed = [], []
    for label, value, ref in checks:
        ratio = value / ref if ref > 0 else (1.0 if value <= 0 else float("inf"))
        if label in p.criteria:
            parts.append(f"{label} x{ratio:.2f} {'PASS' if ratio <= LIMIT else 'FAIL'}")
            if ratio > LIMIT:
                failed.append(label)
        else:
            parts.append(f"{label} x{ratio:.2f}")
    parts.append(f"verdict {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}")
    return parts


def dead_case(run: Run, workdir: Path) -> None:
    """Dead endpoints on a second channel, beside the healthy traffic."""
    args, broker = run.args, run.broker
    hang, fail = DeadEndpoint("hang"), DeadEndpoint("refuse" if args.fail_mode == "refuse" else "fail")
    try:
        s = broker.session
        assert s.put(f"{broker.url}/channel/{DEAD_CHANNEL}", data={"token": "bench-c"}).status_code == 200
        for consumer, endpoint in (("hang", hang), ("fail", fail)):
            r = s.put(f"{broker.url}/channel/{DEAD_CHANNEL}/consumer/{consumer}",
                      data={"token": f"{consumer}-token", "maxInFlight": "500",
                            "callbackUrl": f"http://127.0.0.1:{endpoint.port}/{consumer}"})
            assert r.status_code == 200, r.text
        started = time.time()
        left = args.dead_seconds
        for name, seconds in (("dead: first minute", min(60.0, left)), ("dead: then", max(0.0, left - 60.0))):
            if seconds <= 0:
                continue
            p = run.phase(name, seconds, feeder=Feeder(broker.url, args.dead_rate, args.dead_batch, seconds))
            # the issue bounds the healthy consumer's callbacks; CPU per message counts both channels'
            # messages, and the second channel's data grows the database by design
            p.criteria = ("callback p99",)
            for consumer, endpoint in (("hang", hang), ("fail", fail)):
                opened, requests = endpoint.stats()
                busiest = max((sum(1 for t in opened if s0 <= t < s0 + 1.0) for s0 in opened), default=0)
                circuit = s.get(f"{broker.url}/channel/{DEAD_CHANNEL}/consumer/{consumer}").json().get("Circuit", {})
                p.notes.append(f"{consumer} endpoint ({endpoint.mode}) since the case began "
                               f"{time.time() - started:.0f} s ago: {len(opened)} connections "
                               f"(busiest second {busiest}), {requests} requests; circuit {circuit.get('State')} "
                               f"({circuit.get('Failures')} failures)")
    finally:
        hang.stop()
        fail.stop()


def report_case(run: Run, workdir: Path) -> None:
    """The Spark report against the live database, beside the healthy traffic."""
    args = run.args
    why = spark_missing()
    if why:
        print(f"case report: skipped, {why}", flush=True)
        return
    proc = report_start(run.broker, workdir)
    run.extra_groups["report"] = ("pgrp", proc.pid)
    started, chunk = time.monotonic(), []
    try:
        while proc.poll() is None and time.monotonic() - started < args.report_seconds:
            chunk.append(run.phase("report", args.report_chunk, keep=False))
    finally:
        if proc.poll() is None:
            _kill(proc)
        run.extra_groups.pop("report", None)
    merged = phase_merge("report", chunk)
    merged.notes.append(f"report exit status {proc.returncode} after {time.monotonic() - started:.0f} s "
                        f"(log: {workdir / 'report.log'})")
    run.phases.append(merged)
    run.phase("after report", args.after)


def phase_merge(name: str, parts: list[Phase]) -> Phase:
    """Consecutive phases as one (their sequence ranges follow each other)."""
    if not parts:
        return Phase(name=name)
    total = sum(p.seconds for p in parts)
    n = [max(1, p.published + p.other) for p in parts]
    return Phase(name=name, seconds=total, first=parts[0].first, sent=sum(p.sent for p in parts), wall=parts[0].wall,
                 rate=sum(p.rate * p.seconds for p in parts) / max(total, 1e-9),
                 published=sum(p.published for p in parts), failed=sum(p.failed for p in parts),
                 other=sum(p.other for p in parts),
                 cpu={k: sum(p.cpu.get(k, 0.0) * m for p, m in zip(parts, n)) / sum(n)
                      for k in {k for p in parts for k in p.cpu}},
                 dead_tuples=parts[-1].dead_tuples, growth=sum(p.growth * p.seconds for p in parts) / max(total, 1e-9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="dead,report,hold",
                        help="which cases, in order: hold, dead, report (the hold last: its backlog takes longest)")
    parser.add_argument("--settle", type=float, default=600.0,
                        help="at most this many seconds between two cases for the broker to be back at its baseline")
    parser.add_argument("--rate", type=float, default=300.0, help="the healthy single publishes per second")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of traffic before the baseline (not measured)")
    parser.add_argument("--baseline", type=float, default=150.0, help="seconds of the baseline phase")
    parser.add_argument("--hold", type=float, default=600.0, help="seconds the REPEATABLE READ snapshot is held")
    parser.add_argument("--after", type=float, default=120.0, help="seconds of the phase after a hold or report")
    parser.add_argument("--dead-seconds", type=float, default=120.0, help="seconds of the dead endpoints' load")
    parser.add_argument("--dead-rate", type=float, default=900.0, help="messages per second on the dead channel")
    parser.add_argument("--dead-batch", type=int, default=100, help="messages per publish on the dead channel")
    parser.add_argument("--fail-mode", choices=("500", "refuse"), default="500",
                        help="the failing endpoint answers 500 at once, or refuses connections")
    parser.add_argument("--report-seconds", type=float, default=900.0, help="the longest the report may run")
    parser.add_argument("--report-chunk", type=float, default=5.0, help="seconds of each slice of the report phase")
    parser.add_argument("--connections", type=int, default=64, help="the healthy publisher's keep-alive connections")
    parser.add_argument("--pull-batch", type=int, default=500)
    parser.add_argument("--max-in-flight", type=int, default=50, help="the healthy push consumer's maxInFlight")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait for the last deliveries")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    parser.add_argument("--slices", action="store_true", help="print every 10-second slice's worst latencies")
    args = smoke_args_parse(parser, cases="hold,dead", rate=20.0, warmup=1.0, baseline=3.0, hold=3.0, after=2.0,
                            dead_seconds=3.0, dead_rate=60.0, dead_batch=10, connections=4, drain=20.0, settle=10.0)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - {"hold", "dead", "report"}
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")

    workdir, receiver, broker = broker_start(args, "neighbours")
    load = database = None
    problems: list[str] = []
    try:
        database = Database(broker.env["DATABASE_URL"])
        load = Load(broker.url, args.connections, args.pull_batch)
        run = Run(args, broker, receiver, database, load)
        print(f"neighbours: {os.cpu_count()} CPUs, {args.rate:.0f} single publishes/s to a push (maxInFlight "
              f"{args.max_in_flight}) and a pull consumer; cases {', '.join(cases)}; logs in {workdir}", flush=True)
        time.sleep(3.0)  # dispatcher loops start, the puller's first long poll
        run.phase("warm-up", args.warmup, keep=False)
        base = run.phase("baseline", args.baseline)
        run.collect()
        run.latencies(base)
        for n, case in enumerate(cases):
            if n:  # the previous case's after-effects gone first (a backlog drained)
                print(f"before case {case}: {run.settle(base, args.settle)}", flush=True)
            if case == "hold":
                snapshot = Snapshot(broker.env["DATABASE_URL"])
                snapshot.begin()
                try:
                    p = run.phase("hold", args.hold)
                finally:
                    p_note = snapshot.release(database)
                p.notes.append(f"snapshot {p_note}")
                run.phase("after hold", args.after)
            elif case == "dead":
                dead_case(run, workdir)
            elif case == "report":
                report_case(run, workdir)
        missing = run.drain()
        print(f"\nhealthy traffic: {len(run.ok)} published, {missing} deliveries missing after the drain, "
              f"{run.pull_errors} pull/ack errors", flush=True)
        for p in run.phases:
            run.latencies(p)
            phase_print(p, base, show_slices=args.slices)
        problems += [f"{n} {what}" for n, what in (
            (sum(p.failed for p in run.phases), "failed publishes"), (missing, "healthy deliveries missing"),
            (run.pull_errors, "pull/ack errors")) if n]
    finally:
        parts_stop(load, broker, receiver)
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
