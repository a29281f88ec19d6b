"""Capacity and cost per message: single publishes at fixed rates to one push and one pull consumer.

    .venv/bin/python bench/capacity.py                              # rates 300,600,1000, 60 s each
    .venv/bin/python bench/capacity.py --rates 1000 --seconds 300   # issue 28's capacity run
    .venv/bin/python bench/capacity.py --rates 300 --idle 60        # cost per message and at rest
    .venv/bin/python bench/capacity.py --rates 1000 --event-schema  # issue 37: publishes validated
    DATABASE_URL=postgres://... .venv/bin/python bench/capacity.py  # an existing (migrated here) database

Everything runs on this machine as a user runs it: PostgreSQL (a throw-away embedded server, fsync
on), gunicorn and qcluster as `make run` starts them, a push receiver answering 204 at once (its own
process) and the load generator (its own process, on uvloop, reading each answer's head in one
call: it shares the two cores with the broker, and what it spends the broker's figures lose). One
channel with one push consumer (``maxInFlight`` 50) and one pull consumer that pulls batches of up
to 500 (long-polling) and acks them with their ``Receipt`` (``--pull-expires``: the long poll's wait, 5 s by default).

The load is open-loop: a ticker hands out one publish slot every 1/rate s to ``--connections``
keep-alive connections; a slot waits when every connection is busy, and its latency counts from
its slot time (no coordinated omission). Each publish carries its sequence number and send time
(``X-Seq`` and ``X-Sent-At`` metadata headers, and in the JSON body), so lost and duplicated
deliveries are counted per consumer, and publish-to-callback / publish-to-pull latencies measured.

Printed per rate: the achieved rate, publish p50/p99/max, callback and pull p50/p99/max, lost and
duplicated, CPU milliseconds per message of PostgreSQL (the postmaster and all its children, from
/proc), web (gunicorn's process group), workers (qcluster's) and the load generator, and commits
per message (pg_stat_database); then the worst ``--slice``-second slices (10 s; by send time) by
their slowest callback, publish and pull, and every slice's slowest callback and pull. First an idle
figure: the same processes' CPU over ``--idle`` seconds with no traffic (the pull consumer
long-polling), as a share of one core.

``--overload 3000`` adds a run after the rates: ``--overload-base``/s (1,000) for 20 s, 3,000/s for
60 s, the base rate again for 60 s, over up to 4,000 connections (so what waits, waits in the
broker, not in the load tool; the slots it held back anyway are counted). Printed per slice: offered, accepted (201) and refused (503 ``overloaded``, 429)
per second, the slowest answer of each kind and the tails; then each status's share, whether every
publish was answered within 1 s, whether every accepted publish reached both consumers, and how
many seconds after the burst the tails were back to normal (each later slice's p99 within twice the
worst before the burst, at least 50 ms publish and 250 ms callback and pull).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (KeepAlive, build_request, commands_serve, parts_stop, percentile,  # noqa: E402
                          pull_consumer_run, smoke_args_parse, smoke_problems_exit)
from bench.common import EVENT_SCHEMA, EVENT_TYPE, event_payload  # noqa: E402  (issue 37: --event-schema)
from bench.push import PUBLISH_HEADERS, Broker, Receiver, _stat, cpu_by_group  # noqa: E402

SMOKE_TABLE = (r"^idle +[\d.]+ s: .* total [\d.]+ % of one core; .*\n(?s:.*)"
               r"^rate +\d+/s: achieved [\d.]+/s .* publish p50/p99/max .* lost \d+ dup \d+ .*\n"
               r" +CPU ms/msg: postgres [\d.]+, .* broker [\d.]+; commits/msg [\d.]+.*\n"
               r" +[\d.]+ s slices \(\d+\), the worst .*\n(?s:.*)"
               r"^overload: .*\n(?s:.*)"
               r"^  every publish answered within 1 s: .* accepted \d+, refused \d+ .* not delivered .*: 0,")
CHANNEL, PUSHER, PULLER = "capacity", "pusher", "puller"
CHANNEL_TOKEN, PULL_TOKEN = "bench-c", "pull-token"
PAD = "x" * 200  # bodies of ~250 bytes


# --- the load generator (its own process) ---------------------------------------------------------

def _load_main(url: str, connections: int, pull_batch: int, pull_expires: float, conn,
               event_payloads: bool = False, nice: int = 0) -> None:
    """Publisher and puller on one asyncio loop; commands come over ``conn``. ``nice``: added to the
    process's niceness (``--load-nice``; below 0 needs root)."""
    if nice:
        os.nice(nice)
    host, port = url.split("//")[1].split(":")
    port = int(port)
    pulled: list[int] = []
    pull_lat: list[tuple[float, float]] = []  # (send time, publish-to-pull latency)
    pull_errors = [0]

    def taken(jobs: list[dict], now: float) -> None:
        """Each pulled job's sequence number, send time and publish-to-pull latency."""
        for job in jobs:
            payload = json.loads(job["Message"]["Payload"])
            pulled.append(payload["i"])
            pull_lat.append((payload["t"], now - payload["t"]))

    async def publish(schedule: list[tuple[float, float]], first: int, senders: int = connections) -> dict:
        """Open-loop single publishes following ``schedule`` ([(rate, seconds)], back to back) over
        ``senders`` keep-alive connections; sequence numbers from ``first``. Each answer: (slot time,
        latency from the slot, status, latency from the request's sending: the broker's share)."""
        queue: asyncio.Queue = asyncio.Queue()
        answers: list[tuple[float, float, int, float]] = []
        ok: list[int] = []
        path = f"/channel/{CHANNEL}/broadcast"

        async def ticker() -> None:
            start = time.perf_counter()
            wall = time.time() - start
            n, offset = 0, 0.0
            for rate, seconds in schedule:
                for k in range(int(rate * seconds)):
                    due = start + offset + k / rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    queue.put_nowait((first + n, due, wall + due))
                    n += 1
                offset += seconds
            for _ in range(senders):
                queue.put_nowait(None)

        async def sender(connection: KeepAlive) -> None:
            while (item := await queue.get()) is not None:
                seq, due, sent = item
                body = json.dumps({"i": seq, "t": sent, "pad": PAD}).encode()
                headers = {**PUBLISH_HEADERS, "Content-Type": "application/json",
                           "X-Broker-Metadata-Headers": "X-Sent-At,X-Seq", "X-Sent-At": repr(sent), "X-Seq": str(seq)}
                if event_payloads:  # issue 37: the 20-property payload of EVENT_SCHEMA, typed
                    body = json.dumps(event_payload(seq, sent, PAD)).encode()
                    headers["X-Broker-Message-Type"] = EVENT_TYPE
                wrote = time.perf_counter()
                status = await connection.exchange(build_request("POST", path, headers, body))
                now = time.perf_counter()
                answers.append((sent, now - due, status, now - wrote))
                if status == 201:
                    ok.append(seq)
            connection.close()

        opened = [KeepAlive(host, port) for _ in range(senders)]
        # every connection open before the first slot (not a burst of connects at the start)
        for k in range(0, senders, 256):
            await asyncio.gather(*(connection.open() for connection in opened[k:k + 256]))
        gc.freeze()  # the connections and what the tool loaded: out of the collector's full passes (broker.heap)
        started = time.perf_counter()
        began = time.time()
        await asyncio.gather(ticker(), *(sender(connection) for connection in opened))
        statuses: dict[int, int] = {}
        for _, _, status, _ in answers:
            statuses[status] = statuses.get(status, 0) + 1
        return {"seconds": time.perf_counter() - started, "began": began, "answers": answers, "ok": ok,
                "statuses": statuses}

    async def answer(cmd: tuple):
        """What ``Load.ask`` gets back."""
        if cmd[0] == "publish":  # (rate, seconds, first): one rate (bench/neighbours.py too)
            rate, seconds, first = cmd[1:]
            return await publish([(rate, seconds)], first)
        if cmd[0] == "schedule":  # (schedule, first[, senders])
            return await publish(*cmd[1:])
        if cmd[0] in ("pulled", "pulled timed"):  # latencies alone, or (send time, latency) each
            out = (list(pulled), list(pull_lat) if cmd[0] == "pulled timed" else [lat for _, lat in pull_lat],
                   pull_errors[0])
            pulled.clear()
            pull_lat.clear()
            pull_errors[0] = 0  # each answer: what happened since the last (callers add them up)
            return out

    puller = pull_consumer_run(url, channel=CHANNEL, consumer=PULLER, channel_token=CHANNEL_TOKEN,
                               consumer_token=PULL_TOKEN, batch=pull_batch, expires=pull_expires, taken=taken,
                               errors=pull_errors)
    # uvloop, as the broker's own web server: on 2 cores the load generator's CPU is the broker's loss
    uvloop.run(commands_serve(conn, answer, beside=puller))


class Load:
    def __init__(self, url: str, connections: int, pull_batch: int, pull_expires: float = 5.0,
                 event_payloads: bool = False, nice: int = 0) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_load_main, args=(url, connections, pull_batch, pull_expires, child,
                                                                    event_payloads, nice),
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
            self.conn.execute("SELECT pg_stat_reset()")  # (the trigger functions' times, with track_functions)
            return True
        except Exception:  # noqa: BLE001 - not in shared_preload_libraries: no statement figures
            return False

    def statements_print(self, per: float, label: str, top: int = 15) -> None:
        """The statements run since the reset, most total time first: calls per ``label``, mean ms."""
        rows = self.conn.execute(
            "SELECT calls, total_exec_time, plans, total_plan_time, regexp_replace(left(query, 110), '\\s+', ' ', 'g')"
            "  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time + total_plan_time DESC LIMIT %s", [top]).fetchall()
        functions = self.conn.execute(
            "SELECT funcname, calls, self_time FROM pg_stat_user_functions WHERE calls > 0"
            " ORDER BY self_time DESC LIMIT 8").fetchall()  # only with track_functions (BROKER_EMBEDDED_PG_OPTIONS)
        if functions:
            print("    functions (triggers), self ms/" + label + ": " + ", ".join(
                f"{name} {ms / per:.4f} ({calls / per:.3f} calls)" for name, calls, ms in functions), flush=True)
        for calls, total, plans, planning, query in rows:
            print(f"    {(total + planning) / per:7.4f} ms/{label} {calls / per:8.3f} calls/{label} {total / max(1, calls):7.3f} ms"
                  + (f" (+{plans / per:.3f} plans {planning / plans:.3f} ms)" if plans else "") + f"  {query}", flush=True)

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

    def backends_watch(self, seconds: float) -> dict[str, int]:
        """Sleep ``seconds`` looking at pg_stat_activity every 0.2 s: the processes the server started
        meanwhile, counted by what they are (application_name, else the backend type). An idle broker
        that opens sessions pays each one's start and its first plans (the "ended since" CPU)."""
        seen = {pid for (pid,) in self.conn.execute("SELECT pid FROM pg_stat_activity").fetchall()}
        started: dict[str, int] = {}
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(0.2, left))
            for pid, kind in self.conn.execute(
                    "SELECT pid, CASE WHEN application_name <> '' THEN application_name ELSE backend_type END"
                    "  FROM pg_stat_activity").fetchall():
                if pid not in seen:
                    seen.add(pid)
                    started[kind] = started.get(kind, 0) + 1
        return started

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
    started = database.backends_watch(seconds) if counting else time.sleep(seconds)
    after, wall, commits1 = cpu_by_group(g), time.monotonic() - t0, database.commits()
    share = {name: 100.0 * (after[name] - before[name]) / wall for name in g}
    line = (f"idle {wall:5.1f} s: " + ", ".join(f"{name} {share[name]:.2f} %" for name in g)
            + f"; broker total {sum(v for k, v in share.items() if k != 'load'):.2f} % of one core; "
            f"{(commits1[0] - commits0[0]) / wall:.1f} commits/s, {commits1[1] - commits0[1]} new connections")
    print(line, flush=True)
    if counting:
        database.statements_print(wall, "s")
        database.backends_print(backends0, wall, "s", after["postgres"] - before["postgres"])
        print("    server processes started while idle: " + (", ".join(
            f"{kind} x{n}" for kind, n in sorted(started.items(), key=lambda kv: -kv[1])) or "none"), flush=True)
    return share


SLICE = 10.0  # seconds: the slices of time the worst latencies are reported by (``--slice``'s default)
REFUSALS = (503, 429)  # an admission refusal (503 overloaded) or a rate limit (429): answered, not lost


def schedule_run(broker: Broker, receiver: Receiver, database: Database, load: Load, *,
                 schedule: list[tuple[float, float]], first: int, drain: float, statements: bool = False,
                 connections: int | None = None, width: float = SLICE) -> dict:
    """Publish following ``schedule``, wait for every delivery of an accepted publish (until ``drain``
    s pass without a new one), count: the figures of the whole run and, per slice of ``width`` seconds, by send time."""
    g = groups(broker, database, load)
    receiver.ask("reset")
    load.ask("pulled")  # clear
    counting = database.statements_reset() if statements else False
    cpu0, commits0, backends0 = cpu_by_group(g), database.commits(), database.backends()
    result = load.ask("schedule", schedule, first, *([connections] if connections else []))
    cpu1, commits1 = cpu_by_group(g), database.commits()
    ok = set(result["ok"])
    deadline, drained = time.monotonic() + drain, time.monotonic()
    pushed, pulled, pull_timed, pull_errors = [], [], [], 0
    while True:
        count = len(pushed) + len(pulled)
        pushed = receiver.ask("seqs")
        got, timed, errors = load.ask("pulled timed")
        pulled += got
        pull_timed += timed
        pull_errors += errors
        if len(pushed) + len(pulled) > count:  # still delivering: wait on (a backlog after a burst)
            deadline = time.monotonic() + drain
        if (ok <= set(pushed) and ok <= set(pulled)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    drained = time.monotonic() - drained
    push_timed = receiver.ask("timed")
    answers, statuses = result["answers"], result["statuses"]
    n = max(1, len(ok))
    cpu = {name: 1000.0 * (cpu1[name] - cpu0[name]) / n for name in g}
    if counting:
        database.statements_print(n, "msg")
        database.backends_print(backends0, n, "msg", cpu1["postgres"] - cpu0["postgres"])
    return {
        "achieved": len(ok) / result["seconds"], "published": len(ok), "statuses": statuses,
        "failed": sum(v for k, v in statuses.items() if k != 201),
        "publish": tails_ms([lat for _, lat, st, _ in answers if st == 201]),
        "service_max": 1000 * max((service for *_, service in answers), default=0.0),
        "held": sum(1 for _, lat, _, service in answers if lat - service > 0.05),
        "callback": tails_ms([lat for _, lat in push_timed]),
        "pull": tails_ms([lat for _, lat in pull_timed]),
        "lost": len(ok - set(pushed)) + len(ok - set(pulled)),
        "dup": (len(pushed) - len(set(pushed))) + (len(pulled) - len(set(pulled))),
        "pull_errors": pull_errors, "cpu": cpu, "commits": (commits1[0] - commits0[0]) / n,
        "connections": commits1[1] - commits0[1],
        "slices": slices_make(result["began"], answers, push_timed, pull_timed, width=width), "width": width,
        "drained": drained,
    }


def tails_ms(latencies: list[float]) -> list[float]:
    """p50, p99 and max of ``latencies`` (seconds) in ms; NaN when there are none."""
    if not latencies:
        return [float("nan")] * 3
    return [1000 * percentile(latencies, 50), 1000 * percentile(latencies, 99), 1000 * max(latencies)]


def slices_make(began: float, answers, push_timed, pull_timed, *, width: float) -> list[dict]:
    """Per ``width`` seconds of send time: publishes offered and answered by status, the slowest answer
    of each kind, publish p99 (201s), callback and pull p99 and max (ms)."""
    out: dict[int, dict] = {}

    def slice_of(sent: float) -> dict:
        k = max(0, int((sent - began) // width))
        return out.setdefault(k, {"start": k * width, "offered": 0, "statuses": {}, "publish": [], "refused": [],
                                  "callback": [], "pull": []})

    for sent, lat, status, _ in answers:
        entry = slice_of(sent)
        entry["offered"] += 1
        entry["statuses"][status] = entry["statuses"].get(status, 0) + 1
        entry["publish" if status == 201 else "refused"].append(1000 * lat)
    for name, timed in (("callback", push_timed), ("pull", pull_timed)):
        for sent, lat in timed:
            slice_of(sent)[name].append(1000 * lat)
    for entry in out.values():
        for name in ("publish", "refused", "callback", "pull"):
            values = entry[name]
            entry[name] = (percentile(values, 99), max(values)) if values else (float("nan"), float("nan"))
    return [out[k] for k in sorted(out)]


def slices_worst_print(slices: list[dict], width: float, top: int = 3) -> None:
    """The worst ``width``-second slices of a run (by send time): the ``top`` slowest by their worst
    callback, publish and pull, how many had a callback over 1 s, then every slice's worst callback
    and pull (ms), so a bad stretch shows where it was."""
    def worst(name: str) -> str:
        ranked = sorted((s for s in slices if s[name][1] == s[name][1]), key=lambda s: -s[name][1])[:top]
        return "/".join(f"{s[name][1]:.0f}" for s in ranked) + " ms (at " + ", ".join(f"{s['start']:g}" for s in ranked) + " s)"
    over = sum(1 for s in slices if s["callback"][1] > 1000)
    print(f"          {width:g} s slices ({len(slices)}), the worst {top} by their slowest: callback {worst('callback')}; "
          f"publish {worst('publish')}; pull {worst('pull')}; slices with a callback over 1 s: {over}", flush=True)
    print("          worst callback/pull per slice (ms, from the slice's start in s): " + " ".join(
        f"{s['start']:g}:{s['callback'][1]:.0f}/{s['pull'][1]:.0f}" for s in slices), flush=True)


def rate_run(broker: Broker, receiver: Receiver, database: Database, load: Load, *, rate: float, seconds: float,
             first: int, drain: float, statements: bool = False, width: float = SLICE) -> dict:
    """One rate: publish, wait for every delivery (until ``drain`` s pass without one), count and print."""
    out = schedule_run(broker, receiver, database, load, schedule=[(rate, seconds)], first=first, drain=drain,
                       statements=statements, width=width)
    out["rate"] = rate
    cpu = out["cpu"]
    p, c, q = out["publish"], out["callback"], out["pull"]
    print(f"rate {rate:5.0f}/s: achieved {out['achieved']:.1f}/s ({out['published']} published, {out['failed']} "
          f"failed {out['statuses']}) | publish p50/p99/max {p[0]:.1f}/{p[1]:.1f}/{p[2]:.0f} ms | "
          f"callback p50/p99/max {c[0]:.0f}/{c[1]:.0f}/{c[2]:.0f} ms | pull p50/p99/max "
          f"{q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f} ms | lost {out['lost']} dup {out['dup']} "
          f"(pull/ack errors {out['pull_errors']})", flush=True)
    cpu_print("CPU ms/msg", out)
    slices_worst_print(out["slices"], out["width"])
    return out


def cpu_print(label: str, out: dict) -> None:
    """CPU ms per (accepted) message by group; the broker's total is PostgreSQL + web + workers (the
    load generator is not the broker)."""
    cpu = out["cpu"]
    print(f"          {label}: " + ", ".join(f"{name} {ms:.3f}" for name, ms in cpu.items())
          + f"; broker {cpu['postgres'] + cpu['web'] + cpu['workers']:.3f}; commits/msg {out['commits']:.3f}; "
          f"{out['connections']} new database connections", flush=True)


def refusals_counted(broker: Broker) -> dict[str, float]:
    """``broker_publish_refused_total`` by reason, as /metrics says (every web process's, written
    at most a second late)."""
    prefix = 'broker_publish_refused_total{reason="'
    text = broker.session.get(f"{broker.url}/metrics", timeout=30).text
    return {line[len(prefix):].split('"')[0]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith(prefix)}


def overload_run(broker: Broker, receiver: Receiver, database: Database, load: Load, *, base: float, peak: float,
                 before: float, burst: float, after: float, first: int, drain: float, connections: int,
                 width: float = SLICE) -> dict:
    """``base``/s for ``before`` s, ``peak``/s for ``burst`` s, ``base``/s for ``after`` s, back to back:
    per slice what was offered, accepted (201) and refused (503 overloaded), how long the slowest answer
    of each took, and the tails; then whether every publish was answered within a second, nothing
    accepted was lost, and how long after the burst the tails were back to what they were before it."""
    counted = refusals_counted(broker)
    out = schedule_run(broker, receiver, database, load, schedule=[(base, before), (peak, burst), (base, after)],
                       first=first, drain=drain, connections=connections, width=width)
    counted = {k: v - counted.get(k, 0) for k, v in refusals_counted(broker).items()}
    print(f"overload: {base:g}/s for {before:g} s, {peak:g}/s for {burst:g} s, {base:g}/s for {after:g} s over "
          f"{connections} connections (slices of {width:g} s by send time; ms)", flush=True)
    print("  slice       offered/s   201/s   503/s   429/s other | slowest 201 / refusal | publish p99 | "
          "callback p99/max | pull p99/max", flush=True)
    for s in out["slices"]:
        st = s["statuses"]
        other = sum(v for k, v in st.items() if k != 201 and k not in REFUSALS)
        print(f"  {s['start']:5g}-{s['start'] + width:<5g} {s['offered'] / width:8.0f} {st.get(201, 0) / width:7.0f} "
              f"{st.get(503, 0) / width:7.0f} {st.get(429, 0) / width:7.0f} {other:5d} | "
              f"{s['publish'][1]:11.0f} / {s['refused'][1]:7.0f} | "
              f"{s['publish'][0]:11.0f} | {s['callback'][0]:7.0f}/{s['callback'][1]:<7.0f} | "
              f"{s['pull'][0]:6.0f}/{s['pull'][1]:<6.0f}", flush=True)
    slowest = max((x for s in out["slices"] for x in (s["publish"][1], s["refused"][1]) if x == x), default=0.0)
    calm = [s for s in out["slices"] if s["start"] + width <= before]
    normal = {name: max(250.0 if name != "publish" else 50.0, 2 * max((s[name][0] for s in calm if s[name][0] == s[name][0]),
                                                                       default=0.0))
              for name in ("publish", "callback", "pull")}
    burst_end = before + burst
    # (a straggler sent at the schedule's very end opens a slice of its own past it: not the after phase)
    after_slices = [s for s in out["slices"] if burst_end <= s["start"] < burst_end + after]
    back = None
    for i, s in enumerate(after_slices):
        if all(all(not (x[name][0] > normal[name]) for name in normal) for x in after_slices[i:]):
            back = s["start"] - burst_end
            break
    st = out["statuses"]
    offered = max(1, sum(st.values()))
    refused = sum(st.get(k, 0) for k in REFUSALS)
    share = ", ".join(f"{k} {100.0 * v / offered:.1f} %" for k, v in sorted(st.items()))
    print(f"  answered: {share} of {offered} (0: no answer within 60 s or a cut connection)", flush=True)
    print(f"  slowest answer from its request's sending (the broker's share): {out['service_max']:.0f} ms; "
          f"slots the load tool held back (every connection busy, > 50 ms): {out['held']}; deliveries drained "
          f"{out['drained']:.0f} s after the last publish", flush=True)
    print(f"  every publish answered within 1 s: {'yes' if slowest <= 1000 else 'NO'} (slowest {slowest:.0f} ms); "
          f"accepted {out['published']}, refused {refused} (503/429), other failures "
          f"{out['failed'] - refused}; accepted and not delivered (push + pull): {out['lost']}, dup {out['dup']}; "
          f"tails normal (p99 publish <= {normal['publish']:.0f}, callback <= {normal['callback']:.0f}, pull <= "
          f"{normal['pull']:.0f} ms) "
          + (f"{back:g} s after the burst" if back is not None else "NOT within the run"), flush=True)
    print(f"  /metrics broker_publish_refused_total over the run: {sum(counted.values()):.0f} ("
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(counted.items())) + f"); 503 answers seen: {st.get(503, 0)}",
          flush=True)
    cpu_print("CPU ms/accepted msg", out)
    out["slowest"], out["back"] = slowest, back
    return out


def channel_create(broker: Broker, receiver_port: int, max_in_flight: int, *, channel: str = CHANNEL) -> None:
    """``channel`` with its push consumer PUSHER (calling the receiver on ``receiver_port``) and its
    pull consumer PULLER (bench/sources.py's channel too)."""
    s = broker.session
    r = s.put(f"{broker.url}/channel/{channel}", data={"token": CHANNEL_TOKEN})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{channel}/consumer/{PUSHER}",
              data={"token": "t0", "callbackUrl": f"http://127.0.0.1:{receiver_port}/{channel}/{PUSHER}",
                    "maxInFlight": str(max_in_flight)})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{channel}/consumer/{PULLER}", data={"token": PULL_TOKEN, "type": "pull"})
    assert r.status_code == 200, r.text


def broker_start(args, name: str) -> tuple[Path, Receiver, Broker]:
    """A work directory (``bench-<name>-``), the push receiver and the broker with the channel of
    ``channel_create`` (bench/neighbours.py's healthy traffic runs on the same); both stopped again if
    the channel cannot be made."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    receiver = Receiver()
    broker = Broker(args, workdir)
    try:
        channel_create(broker, receiver.port, args.max_in_flight)
    except BaseException:
        parts_stop(broker, receiver)
        raise
    return workdir, receiver, broker


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
    parser.add_argument("--pull-expires", type=float, default=5.0,
                        help="seconds a pull waits for jobs (the idle figure: 1 s costs a long-poll cycle a second)")
    parser.add_argument("--max-in-flight", type=int, default=50)
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds without a new delivery before the ones still missing count as lost")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--server", choices=("gunicorn", "granian"), default="gunicorn",
                        help="the web server (granian: pip install granian; for a side-by-side comparison)")
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    parser.add_argument("--slice", type=float, default=SLICE,
                        help="seconds of the slices the worst latencies (and the overload run) are shown by")
    parser.add_argument("--overload", type=float, default=0.0,
                        help="after the rates: offer this many publishes/s for --overload-burst s between "
                             "--overload-base/s phases (e.g. 3000: twice what the machine holds); 0: no such run")
    parser.add_argument("--overload-base", type=float, default=1000.0, help="publishes/s before and after the burst")
    parser.add_argument("--overload-before", type=float, default=20.0)
    parser.add_argument("--overload-burst", type=float, default=60.0)
    parser.add_argument("--overload-after", type=float, default=60.0)
    parser.add_argument("--overload-connections", type=int, default=4000,
                        help="the publisher's connections in the overload run (enough that the load tool "
                             "never holds a slot back: what waits, waits in the broker; opened as needed)")
    parser.add_argument("--load-nice", type=int, default=0,
                        help="added to the load generator's niceness (e.g. -10, as root: on a 2-core machine "
                             "the broker starves it of CPU in an overload and its own lateness shows as the "
                             "broker's; a diagnostic: the README's figures are at 0 unless they say otherwise)")
    parser.add_argument("--rate-limit", type=float, default=0.0,
                        help="give the bench producer rateLimitPerSecond (and burst) of this value: the "
                             "cost of a rate-limited producer (issue 38); 0: none")
    parser.add_argument("--statements", action="store_true",
                        help="print the top statements of each phase (pg_stat_statements: loaded into the "
                             "embedded server; an existing server must have it in shared_preload_libraries)")
    parser.add_argument("--event-schema", action="store_true",
                        help="issue 37: a 20-property schema on the channel (bench/common.py EVENT_SCHEMA) and "
                             "publishes of its type that validate (implies --event-payload)")
    parser.add_argument("--event-payload", action="store_true",
                        help="the same typed 20-property payloads without the schema (the like-for-like baseline)")
    args = smoke_args_parse(parser, rates="20", seconds=3.0, idle=2.0, connections=4, drain=20.0, overload=40.0,
                            overload_base=20.0, overload_before=2.0, overload_burst=2.0, overload_after=2.0,
                            overload_connections=16, slice=1.0)

    if args.statements and not os.environ.get("DATABASE_URL"):
        os.environ["BROKER_EMBEDDED_PG_OPTIONS"] = (os.environ.get("BROKER_EMBEDDED_PG_OPTIONS", "")
                                                    + " -c shared_preload_libraries=pg_stat_statements"
                                                    " -c pg_stat_statements.track_planning=on")
    workdir, receiver, broker = broker_start(args, "capacity")
    load = database = None
    problems: list[str] = []
    try:
        if args.rate_limit > 0:
            r = broker.session.put(f"{broker.url}/producer/bench-producer", data={
                "rateLimitPerSecond": f"{args.rate_limit:g}", "burst": str(max(1, int(args.rate_limit)))},
                headers={"If-Unmodified-Since": broker.session.get(f"{broker.url}/producer/bench-producer")
                         .headers["Last-Modified"]})
            assert r.status_code == 200, r.text
        if args.event_schema:
            event_schema_put(broker)
        database = Database(broker.env["DATABASE_URL"])
        load = Load(broker.url, args.connections, args.pull_batch, args.pull_expires,
                    args.event_schema or args.event_payload, nice=args.load_nice)
        extras = (f", load generator nice {args.load_nice:+d}" if args.load_nice else "") + (
            f", producer rate-limited at {args.rate_limit:g}/s" if args.rate_limit else "")
        print(f"capacity: {os.cpu_count()} CPUs, 1 push consumer (maxInFlight {args.max_in_flight}) + 1 pull consumer "
              f"(batch {args.pull_batch}, expires {args.pull_expires:g} s, Receipt acks), {args.connections} publisher "
              f"connections, {args.web_workers} web workers{extras}; logs in {workdir}", flush=True)
        time.sleep(3.0)  # dispatcher loops start, the puller's first long poll
        if args.idle > 0:
            idle(broker, database, load, args.idle, statements=args.statements)
        first = 0
        for rate in [float(x) for x in args.rates.split(",") if x.strip()]:
            out = rate_run(broker, receiver, database, load, rate=rate, seconds=args.seconds, first=first,
                           drain=args.drain, statements=args.statements, width=args.slice)
            first += int(rate * args.seconds)
            problems += [f"rate {rate:.0f}: {n} {what}" for n, what in (
                (out["failed"], "failed publishes"), (out["lost"], "lost deliveries"),
                (out["pull_errors"], "pull/ack errors")) if n]
            if not out["published"]:
                problems.append(f"rate {rate:.0f}: nothing published")
        if args.overload > 0:
            out = overload_run(broker, receiver, database, load, base=args.overload_base, peak=args.overload,
                               before=args.overload_before, burst=args.overload_burst, after=args.overload_after,
                               first=first, drain=args.drain, connections=args.overload_connections, width=args.slice)
            refused = sum(out["statuses"].get(k, 0) for k in REFUSALS)
            problems += [f"overload: {n} {what}" for n, what in (
                (out["failed"] - refused, "failed publishes (not 503/429)"), (out["lost"], "lost deliveries")) if n]
    finally:
        parts_stop(load, broker, receiver)
    smoke_problems_exit(problems=problems)  # failed publishes, lost deliveries: exit 1, at any size


if __name__ == "__main__":
    main()
