"""Soak: a broker's lifetime under steady traffic, with retention on: the same cost after hours as after minutes.

    .venv/bin/python bench/soak.py                          # 30 min, 300 msg/s, retention 2m (throw-away PostgreSQL)
    .venv/bin/python bench/soak.py --seconds 300            # 5 min: the verdict's windows scaled down
    .venv/bin/python bench/soak.py --rate 150 --retention 5m --seconds 3600
    DATABASE_URL=postgres://... .venv/bin/python bench/soak.py   # an existing (migrated here) database

One channel (its ``retention`` field set to ``--retention``) with one push consumer (a raw asyncio
receiver in its own process answering 204; ``maxInFlight`` 50, ``--max-in-flight``) and one pull consumer (a thread pulling batches with a
1 s long poll and acking them). Steady single-message publishes at ``--rate`` come from an asyncio
load generator in its own thread (``--connections`` keep-alive connections, the requests written
by hand: one core's small share is enough for 300 msg/s on loopback); it reports what it actually
achieved, since on a 2-core machine the broker, PostgreSQL and the load share the cores.

Every ``--every`` seconds (60; in a run under 20 minutes scaled like the verdict's windows) it
prints a block: throughput of publish (its target, and the slots not answered yet), push and pull; publish-to-delivery latency p50/p95/p99 of push and pull (from the publisher's send time,
an ``X-Sent-At`` metadata header, to the callback's arrival or the pull's answer); the database
size and each big table's live and dead tuples and autovacuum count (pg_stat_user_tables); the RSS
of every broker process (each gunicorn and qcluster process; PostgreSQL as the PSS total of the
postmaster and its backends, so shared buffers count once, and their private memory); what
retention removed in the interval (from the channel GET's ``Footprint``), its runs (/metrics) and
the longest one (the sweep's last-run row, sampled four times a second), the oldest stored
message's age, and the CPU the load generator's process used itself.

The verdict compares the last 10 minutes with minutes 5 to 10 (``--seconds`` under 20 minutes:
both windows scaled by seconds/1200, said in the output): database size within +-15 % (means),
p99 of push and of pull within 1.25x (all samples of each window), RSS within +-10 % (means of the
gunicorn total, the qcluster total and PostgreSQL's private memory per process), no retention run
longer than 2 s over the whole run (the run-duration histogram of /metrics, exact), and dead tuples
under 20 % of live on jobs_job and broker_message at every report of the last window. One PASS or
FAIL line per criterion, then the overall verdict; the exit status is 1 on FAIL (not in --smoke,
whose few seconds make no verdict). Everything is on 127.0.0.1 and stops by itself.

The dead tuples of jobs_job (an INSERT, two UPDATEs and a DELETE per job) between two vacuums
depend on the server's ``autovacuum_naptime`` (the embedded server: 5 s; at 10 s they reached 19.7-19.9 %
of live at the worst report of the last window) and on autovacuum getting
CPU: a 10-minute run at 300 msg/s with a 2-minute retention kept them near 1 % of live, but on an
overloaded 2-core machine (load 15) with a 30 s retention they reached 35-90 % at the reports, and
``BROKER_EMBEDDED_PG_OPTIONS="-c autovacuum_naptime=2s"`` brought most reports under 20 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (
    _read_response,
    build_request,
    parts_stop,
    smoke_args_parse,
    smoke_problems_exit,
)
from bench.push import ADMIN, PUBLISH_HEADERS, Broker, Receiver
from broker.durations import duration_parse

SMOKE_TABLE = (r"^t= +\d+s publish +[\d.]+/s \(target [\d.]+.*\) push .* pull .*\| latency ms push .* pull .*\n"
               r" +db [\d.]+ MB \| .*message \d+/\d+.*\n +RSS MB web \[.*\n +retention removed \d+ messages.*\n"
               r"(?s:.*)^load generator: .*\n(?s:.*)^verdict: ")
BIG = ["broker_message", "jobs_job", "jobs_jobtransition", "jobs_deliveryattempt", "broker_counterdelta"]
VACUUMED = ["jobs_job", "broker_message"]  # the verdict's dead-tuple criterion
BASE_WINDOW, LAST_WINDOW, FULL = (300.0, 600.0), 600.0, 1200.0  # seconds (for a run of 20 minutes or more)
EVERY = 60.0  # seconds between reports
SETTLE = 30.0  # seconds past the retention before the tables can be at their steady size (sweep, vacuum)
DB_BAND, P99_FACTOR, RSS_BAND, RUN_MAX, DEAD_SHARE = 0.15, 1.25, 0.10, 2.0, 0.20
CHANNEL, PULLER = "soak", "puller"


def pct(values: list[float], p: float) -> float:
    """Percentile ``p`` of ``values`` in milliseconds (nan without any)."""
    if not values:
        return float("nan")
    values = sorted(values)
    return 1000.0 * values[min(len(values) - 1, int(p / 100.0 * len(values)))]


# --- memory (Linux /proc) -------------------------------------------------------------------------

def _proc_kb(path: str, key: str) -> int:
    """The kB figure of line ``key:`` in a /proc file; 0 when the process or the line is gone."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ids(pid: int) -> tuple[int, int] | None:
    """(ppid, process group)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def memory(web_pgrp: int, workers_pgrp: int, postmaster: int | None) -> dict:
    """{"web": {pid: RSS MB}, "qcluster": {pid: RSS MB}, "postgres": PSS MB of the postmaster and its
    backends, "pg_private": their private anonymous MB, "pg_n": how many}. PostgreSQL's RSS and PSS
    grow as table pages enter shared buffers (not a leak): it is judged by private memory."""
    procs = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _ids(int(p))) is not None}

    def rss(pid: int) -> float:
        return _proc_kb(f"/proc/{pid}/status", "VmRSS") / 1024

    web = {pid: rss(pid) for pid, (_, pgrp) in procs.items() if pgrp == web_pgrp}
    workers = {pid: rss(pid) for pid, (_, pgrp) in procs.items() if pgrp == workers_pgrp}
    pg = [pid for pid, (ppid, _) in procs.items() if postmaster and (pid == postmaster or ppid == postmaster)]
    return {"web": {p: m for p, m in web.items() if m}, "qcluster": {p: m for p, m in workers.items() if m},
            "postgres": sum(_proc_kb(f"/proc/{p}/smaps_rollup", "Pss") for p in pg) / 1024,
            "pg_private": sum(_proc_kb(f"/proc/{p}/status", "RssAnon") for p in pg) / 1024, "pg_n": len(pg)}


def _cpu_self() -> float:
    """CPU seconds this process (the load generator, the puller, the reports) used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def postmaster_pid(broker: Broker) -> int | None:
    if broker.server_dir is None:
        return None
    try:
        return int((broker.server_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --- the database's figures -------------------------------------------------------------------------

class Database:
    """Size and tuples (pg_stat_user_tables) of the broker's database, and the retention sweep's
    last run sampled in a thread (the longest run of each interval)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.sampler = psycopg.connect(url, autocommit=True)
        self.lock = threading.Lock()
        self.longest = 0.0  # the longest run seen since the last report
        self.seen: set = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.25):
            try:
                row = self.sampler.execute("SELECT started_at, seconds FROM jobs_retentionrun WHERE id = 1").fetchone()
            except Exception as exc:  # noqa: BLE001 - a lost sample is not a failure of the broker
                print(f"(retention sample lost: {exc})", file=sys.stderr, flush=True)
                continue
            if row and row[0] not in self.seen:
                self.seen.add(row[0])
                with self.lock:
                    self.longest = max(self.longest, float(row[1]))

    def longest_take(self) -> float:
        with self.lock:
            value, self.longest = self.longest, 0.0
        return value

    def figures(self) -> tuple[float, dict]:
        """(database MB, {table: (live, dead, autovacuum count, MB)})."""
        size = self.conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 1e6
        rows = self.conn.execute(
            "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, pg_total_relation_size(relid)"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s)", (BIG,)).fetchall()
        return size, {name: (live, dead, vacuums, mb / 1e6) for name, live, dead, vacuums, mb in rows}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sampler.close()
        self.conn.close()


# --- load -------------------------------------------------------------------------------------------

class Publisher:
    """Single-message publishes at ``rate`` over ``connections`` keep-alive connections (asyncio in
    its own thread): a ticker hands out one slot every 1/rate s; when the broker is slow the slots
    queue up (``lag``) to one second's worth, beyond which they are skipped (counted), so a stall is
    not followed by a burst; ``published`` over time is the achieved rate."""

    def __init__(self, url: str, channel: str, rate: float, connections: int) -> None:
        self.host, port = url.split("//")[1].split(":")
        self.port = int(port)
        self.path = f"/channel/{channel}/broadcast"
        self.rate, self.connections = rate, connections
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.published = self.errors = self.scheduled = self.skipped = 0
        self.backlog = max(1, int(rate))  # slots waiting for a connection: at most one second's worth
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self.thread.start()

    def lag(self) -> int:
        """Slots handed out but not answered yet (at most a second's worth plus the connections)."""
        with self.lock:
            return self.scheduled - self.published - self.errors

    async def _run(self) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def ticker() -> None:
            start, i = time.perf_counter(), 0
            while not self.stop.is_set():
                delay = start + i / self.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                i += 1
                with self.lock:
                    if queue.qsize() >= self.backlog:
                        self.skipped += 1  # a steady rate, not a catch-up burst after a stall
                        continue
                    self.scheduled += 1
                queue.put_nowait(i)
            for _ in range(self.connections):
                queue.put_nowait(None)

        async def sender() -> None:
            reader = writer = None
            while True:
                item = await queue.get()
                if item is None:
                    break
                sent = time.time()
                body = json.dumps({"t": sent}).encode()
                headers = {**PUBLISH_HEADERS, "Content-Type": "application/json",
                           "X-Broker-Metadata-Headers": "X-Sent-At", "X-Sent-At": repr(sent)}
                ok = False
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.write(build_request("POST", self.path, headers, body))
                    status, answer, _ = await asyncio.wait_for(_read_response(reader), 30)
                    ok = status == 201
                    if answer.get("connection", "").lower() == "close":
                        writer.close()
                        writer = None
                except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    if writer is not None:
                        writer.close()
                    writer = None
                with self.lock:
                    if ok:
                        self.published += 1
                    else:
                        self.errors += 1
            if writer is not None:
                writer.close()

        await asyncio.gather(ticker(), *(sender() for _ in range(self.connections)))


class Puller:
    """The pull consumer: batches with a 1 s long poll, acked DELIVERED; latency from the payload's send time."""

    def __init__(self, url: str, channel: str, batch: int) -> None:
        self.base = f"{url}/channel/{channel}/consumer/{PULLER}"
        self.batch = batch
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pulled = self.errors = 0
        self.latencies: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        session = requests.Session()
        headers = {"X-Broker-Channel-Token": "bench-c", "X-Broker-Consumer-Token": "pull-token",
                   "Content-Type": "application/json"}
        body = json.dumps({"batch": self.batch, "expires": 1})
        while not self.stop.is_set():
            try:
                r = session.post(f"{self.base}/pull", data=body, headers=headers, timeout=30)
                now = time.time()
                jobs = r.json()["Result"] if r.status_code == 200 else []
                if r.status_code != 200:
                    with self.lock:
                        self.errors += 1
                    time.sleep(0.2)
                if not jobs:
                    continue
                ack = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}
                r = session.post(f"{self.base}/ack", data=json.dumps(ack), headers=headers, timeout=30)
                with self.lock:
                    self.errors += r.status_code != 200
                    self.pulled += len(jobs)
                    self.latencies += [now - json.loads(j["Message"]["Payload"])["t"] for j in jobs]
            except (requests.RequestException, ValueError, KeyError):
                with self.lock:
                    self.errors += 1
                time.sleep(0.2)


# --- the broker's own figures ------------------------------------------------------------------------

def retention_figures(session: requests.Session, url: str) -> dict:
    """What retention removed from the channel (its GET's Footprint, cumulative), the oldest stored
    message's age, and the sweep's run counters from /metrics (runs, and runs over RUN_MAX s)."""
    footprint = session.get(f"{url}/channel/{CHANNEL}", timeout=30).json()["Footprint"]
    text = requests.get(f"{url}/metrics", timeout=30).text

    def metric(pattern: str) -> float:
        match = re.search(pattern, text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    runs = metric(r"^broker_retention_runs_total (\S+)$")
    within = metric(rf'^broker_retention_run_duration_seconds_bucket{{le="{RUN_MAX}"}} (\S+)$')
    return {"removed": {k.lower(): v for k, v in footprint["RemovedByRetention"].items()},
            "oldest": footprint["OldestMessageAgeSeconds"], "runs": runs, "over": runs - within}


@dataclass
class Report:
    t: float  # seconds since the load started, at the end of the interval
    db_mb: float
    tables: dict
    mem: dict
    push_lat: list[float] = field(default_factory=list)
    pull_lat: list[float] = field(default_factory=list)


def windows(seconds: float) -> tuple[tuple[float, float], tuple[float, float], float]:
    """(baseline window, last window, scale): minutes 5-10 and the last 10 minutes of a run of
    20 minutes or more; a shorter run scales both by seconds/1200."""
    scale = min(1.0, seconds / FULL)
    base = (BASE_WINDOW[0] * scale, BASE_WINDOW[1] * scale)
    return base, (seconds - LAST_WINDOW * scale, seconds), scale


def verdict(reports: list[Report], *, seconds: float, over: float, longest: float) -> list[tuple[str, bool, str]]:
    """[(criterion, passed, figures)] comparing the last window with the baseline window."""
    (b0, b1), (l0, l1), _ = windows(seconds)
    eps = 1e-6
    base = [r for r in reports if b0 + eps < r.t <= b1 + eps]
    last = [r for r in reports if l0 + eps < r.t <= l1 + eps]
    if not base or not last:
        return [("windows", False, f"no report in {'the baseline' if not base else 'the last'} window")]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    out = []
    db_b, db_l = mean([r.db_mb for r in base]), mean([r.db_mb for r in last])
    change = (db_l - db_b) / db_b if db_b else 0.0
    out.append(("database size within +-15 %", abs(change) <= DB_BAND,
                f"{db_b:.1f} MB -> {db_l:.1f} MB ({100 * change:+.1f} %)"))
    for kind in ("push", "pull"):
        p_b = pct([x for r in base for x in getattr(r, f"{kind}_lat")], 99)
        p_l = pct([x for r in last for x in getattr(r, f"{kind}_lat")], 99)
        ratio = p_l / p_b if p_b else float("inf")
        out.append((f"{kind} p99 within {P99_FACTOR}x", ratio <= P99_FACTOR,
                    f"{p_b:.0f} ms -> {p_l:.0f} ms ({ratio:.2f}x)"))
    groups = {"web RSS": lambda m: sum(m["web"].values()), "qcluster RSS": lambda m: sum(m["qcluster"].values()),
              "postgres private/process": lambda m: m["pg_private"] / max(1, m["pg_n"])}
    for name, of in groups.items():
        a, b = mean([of(r.mem) for r in base]), mean([of(r.mem) for r in last])
        change = (b - a) / a if a else 0.0
        out.append((f"{name} within +-10 %", abs(change) <= RSS_BAND, f"{a:.0f} MB -> {b:.0f} MB ({100 * change:+.1f} %)"))
    out.append((f"no retention run over {RUN_MAX:.0f} s", over == 0,
                f"{over:.0f} runs over {RUN_MAX:.0f} s; longest sampled {longest:.3f} s"))
    for table in VACUUMED:
        shares = [r.tables[table][1] / max(1, r.tables[table][0]) for r in last if table in r.tables]
        worst = max(shares) if shares else float("nan")
        out.append((f"{table} dead tuples under 20 % of live", bool(shares) and worst < DEAD_SHARE,
                    f"worst {100 * worst:.1f} %, mean {100 * mean(shares):.1f} % over the last window's reports"))
    return out


def channel_create(broker: Broker, receiver_port: int, retention: str, max_in_flight: int | None) -> None:
    s = broker.session
    r = s.put(f"{broker.url}/channel/{CHANNEL}", data={"token": "bench-c", "retention": retention})
    assert r.status_code == 200, r.text
    data = {"token": "t0", "callbackUrl": f"http://127.0.0.1:{receiver_port}/{CHANNEL}/pusher"}
    if max_in_flight:
        data["maxInFlight"] = str(max_in_flight)
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/pusher", data=data)
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/{PULLER}", data={"token": "pull-token", "type": "pull"})
    assert r.status_code == 200, r.text


def block(r: Report, *, dt: float, rate: float, counts: dict, last: dict, errors: int, lag: int, ret: dict,
          last_ret: dict, longest: float, runs: float, load_cpu: float) -> str:
    removed = {k: v - last_ret["removed"].get(k, 0) for k, v in ret["removed"].items()}
    mem = r.mem
    tables = " ".join(f"{name.split('_', 1)[1]} {live}/{dead} (av {vac})"
                      for name, (live, dead, vac, _) in sorted(r.tables.items(), key=lambda kv: BIG.index(kv[0])))
    oldest = "none" if ret["oldest"] is None else f"{ret['oldest']:.0f} s"
    return (
        f"t={r.t:5.0f}s publish {(counts['pub'] - last['pub']) / dt:6.1f}/s (target {rate:.0f}, errors {errors}, "
        f"lag {lag}, skipped {counts['skipped'] - last.get('skipped', 0)}) "
        f"push {(counts['push'] - last['push']) / dt:6.1f}/s pull {(counts['pull'] - last['pull']) / dt:6.1f}/s"
        f" | latency ms push p50/p95/p99 " + "/".join(f"{pct(r.push_lat, p):.0f}" for p in (50, 95, 99))
        + " pull " + "/".join(f"{pct(r.pull_lat, p):.0f}" for p in (50, 95, 99)) + "\n"
        f"        db {r.db_mb:.1f} MB | live/dead tuples (autovacuums): {tables}\n"
        f"        RSS MB web [{', '.join(f'{m:.0f}' for m in sorted(mem['web'].values()))}]"
        f" qcluster [{', '.join(f'{m:.0f}' for m in sorted(mem['qcluster'].values()))}]"
        f" postgres {mem['postgres']:.0f} PSS, {mem['pg_private']:.0f} private ({mem['pg_n']} procs)"
        f" | load generator CPU {100 * load_cpu:.0f} % of a core\n"
        f"        retention removed {removed.get('messages', 0)} messages, {removed.get('jobs', 0)} jobs, "
        f"{removed.get('transitions', 0)} transitions, {removed.get('attempts', 0)} attempts; "
        f"{runs - last_ret['runs']:.0f} runs, longest {longest:.3f} s; oldest stored message {oldest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--rate", type=float, default=300.0, help="single-message publishes per second")
    parser.add_argument("--retention", default="2m", help="the channel's retention (90s, 2m, 1h, ...)")
    parser.add_argument("--every", type=float, default=None,
                        help="seconds between reports (default 60; a run under 20 minutes scales it with the windows)")
    parser.add_argument("--connections", type=int, default=16, help="the load generator's keep-alive connections")
    parser.add_argument("--pull-batch", type=int, default=50)
    parser.add_argument("--max-in-flight", type=int, default=50,
                        help="push consumer's maxInFlight (50: with the broker's default 10 push delivery "
                             "topped out near 165 msg/s on a busy 2-core machine, below the 300 msg/s published)")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    args = smoke_args_parse(parser, seconds=12.0, rate=30.0, retention="2s", every=2.0, connections=4)
    if args.every is None:  # a report a minute, or as many reports per window as a 20-minute run has
        args.every = max(2.0, EVERY * windows(args.seconds)[2])

    retention_seconds = duration_parse(args.retention)  # the broker's parser: the PUT takes the same
    workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    receiver = Receiver()
    broker = Broker(args, workdir)
    publisher = puller = database = None
    problems: list[str] = []
    try:
        channel_create(broker, receiver.port, args.retention, args.max_in_flight)
        time.sleep(2.0)  # dispatcher loops start
        receiver.ask("reset")
        postmaster = postmaster_pid(broker)
        database = Database(broker.env["DATABASE_URL"])
        (b0, b1), (l0, l1), scale = windows(args.seconds)
        print(f"soak: {args.seconds:.0f} s at {args.rate:.0f} msg/s, retention {args.retention}, 1 push + 1 pull "
              f"consumer, {args.web_workers} web workers, {os.cpu_count()} CPUs, logs in {workdir}", flush=True)
        print(f"verdict windows: baseline {b0:.0f}-{b1:.0f} s, last {l0:.0f}-{l1:.0f} s, a report every "
              f"{args.every:.0f} s" + (f" (windows and reports scaled by {scale:.3f}: the run is shorter than "
                                       f"{FULL / 60:.0f} minutes)" if scale < 1 else ""), flush=True)
        if b0 < retention_seconds + SETTLE:
            print(f"note: the baseline window starts {b0:.0f} s in, before the tables can have reached their "
                  f"steady size (retention {args.retention} plus {SETTLE:.0f} s): for a short run scale --retention "
                  f"too (e.g. --retention {max(1, round(120 * scale))}s)", flush=True)
        publisher = Publisher(broker.url, CHANNEL, args.rate, args.connections)
        puller = Puller(broker.url, CHANNEL, args.pull_batch)
        start = last_t = time.monotonic()
        first_cpu = last_cpu = _cpu_self()
        publisher.start()
        puller.start()
        last = {"pub": 0, "push": 0, "pull": 0, "push_lat": 0, "pull_lat": 0}
        watch = requests.Session()
        watch.headers["X-Broker-Admin-Token"] = ADMIN
        last_ret = {"removed": {}, "runs": 0.0}
        reports: list[Report] = []
        longest_all = 0.0
        over = 0.0
        while time.monotonic() - start < args.seconds - 1e-6:
            time.sleep(max(0.0, min(start + args.seconds, last_t + args.every) - time.monotonic()))
            now = time.monotonic()
            dt = now - last_t
            push_count, _, _, push_lat = receiver.ask("stats")
            with puller.lock:
                pulled, pull_lat = puller.pulled, list(puller.latencies)
            with publisher.lock:
                published, errors, skipped = publisher.published, publisher.errors, publisher.skipped
            mem = memory(broker.web.pid, broker.workers.pid, postmaster)
            db_mb, tables = database.figures()
            ret = retention_figures(watch, broker.url)
            longest = database.longest_take()
            cpu = _cpu_self()
            load_cpu, last_cpu = (cpu - last_cpu) / dt, cpu
            longest_all, over = max(longest_all, longest), ret["over"]
            report = Report(t=now - start, db_mb=db_mb, tables=tables, mem=mem,
                            push_lat=push_lat[last["push_lat"]:], pull_lat=pull_lat[last["pull_lat"]:])
            counts = {"pub": published, "push": push_count, "pull": pulled, "skipped": skipped}
            print(block(report, dt=dt, rate=args.rate, counts=counts, last=last, errors=errors + puller.errors,
                        lag=publisher.lag(), ret=ret, last_ret=last_ret, longest=longest, runs=ret["runs"],
                        load_cpu=load_cpu), flush=True)
            reports.append(report)
            last = {**counts, "push_lat": len(push_lat), "pull_lat": len(pull_lat)}
            last_ret, last_t = ret, now
        elapsed = time.monotonic() - start
        publisher.stop.set()
        puller.stop.set()
        publisher.thread.join(35)
        puller.thread.join(35)
        print(f"load generator: {publisher.published} publishes in {elapsed:.0f} s = "
              f"{publisher.published / elapsed:.1f} msg/s achieved of {args.rate:.0f} target "
              f"({publisher.errors} failed, {publisher.skipped} slots skipped while the broker was a second "
              f"behind, {publisher.scheduled - publisher.published - publisher.errors} unanswered at the end); push {receiver.ask('count')} deliveries, pull {puller.pulled} jobs "
              f"({puller.errors} failed pull/ack requests); its own CPU {100 * (_cpu_self() - first_cpu) / elapsed:.0f} % "
              "of a core (publisher, puller and these reports)", flush=True)
        results = verdict(reports, seconds=args.seconds, over=over, longest=longest_all)
        for name, passed, figures in results:
            print(f"  {'PASS' if passed else 'FAIL'}  {name}: {figures}", flush=True)
        failed = [name for name, passed, _ in results if not passed]
        print(f"verdict: {'PASS' if not failed else 'FAIL (' + ', '.join(failed) + ')'}"
              + (" (smoke: a few seconds make no verdict; not enforced)" if args.smoke else ""), flush=True)
        problems = [f"{n} {what}" for n, what in ((publisher.errors, "failed publishes"),
                                                  (puller.errors, "failed pull/ack requests")) if n]
        problems += [f"no {what}" for n, what in ((publisher.published, "publish"), (receiver.ask("count"),
                                                  "push delivery"), (puller.pulled, "pulled job")) if not n]
        if not last_ret["removed"].get("messages"):
            problems.append("retention removed no message")
        if failed and not args.smoke:
            problems.append("verdict FAIL: " + ", ".join(failed))
    finally:
        for part in (publisher, puller):
            if part is not None:
                part.stop.set()
        if database is not None:
            database.close()
        parts_stop(broker, receiver)
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
