"""Soak: publish + push + pull together for a while, to show that nothing grows without bound.

    .venv/bin/python bench/soak.py                         # 60 s, 100 msg/s, throw-away embedded PostgreSQL
    .venv/bin/python bench/soak.py --seconds 120 --rate 150
    DATABASE_URL=postgres://... .venv/bin/python bench/soak.py   # an existing (migrated here) database

One channel with one push consumer (a raw asyncio receiver in its own process answering 204) and
one pull consumer (a thread pulling batches and acking them); single-message publishes at a steady
``--rate`` from a thread pool. Every ``--every`` seconds (10) it prints one line: throughput of
publish, push and pull (msg/s over the interval), publish-to-delivery latency p50/p95/p99 of push
and pull, the memory of each process (RSS of every gunicorn and qcluster process; PostgreSQL as the
PSS total of the postmaster and its backends, so shared buffers count once) and the rows and size
of the history tables (jobs_jobtransition, jobs_deliveryattempt, broker_counterdelta; jobs_job and
broker_message for comparison). The last line is the verdict: RSS growth between the second and
the last report (PostgreSQL judged by private memory per process: its PSS grows as table pages
enter shared buffers). History tables grow with traffic by design until the archive job
(pipeline/archive.py) prunes them; the counter deltas are compacted by the dispatcher loops.
Everything is on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import smoke_args_parse, smoke_problems_exit  # noqa: E402
from bench.push import PUBLISH_HEADERS, Broker, Receiver  # noqa: E402

SMOKE_TABLE = r"^t= +\d+s publish .* push .* pull .* \| latency ms push .* \| RSS MB web .*\n(?s:.*)^verdict: RSS growth "
HISTORY = ["jobs_jobtransition", "jobs_deliveryattempt", "broker_counterdelta", "jobs_job", "broker_message"]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return 1000.0 * values[min(len(values) - 1, int(p / 100.0 * len(values)))]


# --- memory (Linux /proc) -------------------------------------------------------------------------

def _status(pid: int) -> tuple[int, int, int] | None:
    """(ppid, process group, VmRSS kB)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        rss = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return int(fields[1]), int(fields[2]), rss
    except (OSError, IndexError, ValueError):
        return None


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


def _anon(pid: int) -> int:
    """Private anonymous memory (kB): what a backend's leak would grow; shared buffers excluded."""
    return _proc_kb(f"/proc/{pid}/status", "RssAnon")


def _pss(pid: int) -> int:
    return _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss")


def memory(web_pgrp: int, workers_pgrp: int, postmaster: int | None) -> dict:
    """{"web": [MB per process], "qcluster": [MB per process], "postgres": total MB (PSS), "pg_n": processes,
    "pg_private": private anonymous MB of all of them}. PSS grows as the growing tables' pages enter
    shared buffers (not a leak); the verdict judges PostgreSQL by private memory per process."""
    procs = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _status(int(p))) is not None}
    web = sorted(rss / 1024 for pid, (_, pgrp, rss) in procs.items() if pgrp == web_pgrp and rss)
    workers = sorted(rss / 1024 for pid, (_, pgrp, rss) in procs.items() if pgrp == workers_pgrp and rss)
    pg = [pid for pid, (ppid, _, _) in procs.items() if postmaster and (pid == postmaster or ppid == postmaster)]
    return {"web": web, "qcluster": workers, "postgres": sum(_pss(pid) for pid in pg) / 1024, "pg_n": len(pg),
            "pg_private": sum(_anon(pid) for pid in pg) / 1024}


def postmaster_pid(broker: Broker) -> int | None:
    if broker.server_dir is None:
        return None
    try:
        return int((broker.server_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def tables(database_url: str) -> dict:
    import psycopg

    out = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in HISTORY:
            rows, size = conn.execute(f"SELECT count(*), pg_total_relation_size('{name}') FROM {name}").fetchone()
            out[name] = (rows, size / 1e6)
    return out


# --- load -------------------------------------------------------------------------------------------

class Load:
    def __init__(self, url: str, channel: str, rate: float, pull_batch: int) -> None:
        self.url, self.channel, self.rate, self.pull_batch = url, channel, rate, pull_batch
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.published = 0
        self.publish_errors = 0
        self.pulled = 0
        self.pull_errors = 0  # failed pull or ack requests
        self.pull_latencies: list[float] = []
        self.local = threading.local()

    def _publish(self) -> None:
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = requests.Session()
        now = repr(time.time())
        headers = {**PUBLISH_HEADERS, "Content-Type": "application/json",
                   "X-Broker-Metadata-Headers": "X-Sent-At", "X-Sent-At": now}
        try:
            r = session.post(f"{self.url}/channel/{self.channel}/broadcast", data=json.dumps({"t": float(now)}),
                             headers=headers, timeout=30)
            ok = r.status_code == 201
        except requests.RequestException:
            ok = False
        with self.lock:
            if ok:
                self.published += 1
            else:
                self.publish_errors += 1

    def publisher(self) -> None:
        interval = 1.0 / self.rate
        start = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            i = 0
            while not self.stop.is_set():
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(self._publish)
                i += 1

    def puller(self) -> None:
        session = requests.Session()
        base = f"{self.url}/channel/{self.channel}/consumer/puller"
        headers = {"X-Broker-Channel-Token": "bench-c", "X-Broker-Consumer-Token": "pull-token",
                   "Content-Type": "application/json"}
        body = json.dumps({"batch": self.pull_batch, "expires": 1})
        while not self.stop.is_set():
            try:
                r = session.post(f"{base}/pull", data=body, headers=headers, timeout=30)
                jobs = r.json()["Result"] if r.status_code == 200 else []
                now = time.time()
                if r.status_code != 200:
                    with self.lock:
                        self.pull_errors += 1
                if not jobs:
                    continue
                ack = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}
                r = session.post(f"{base}/ack", data=json.dumps(ack), headers=headers, timeout=30)
                if r.status_code != 200:
                    with self.lock:
                        self.pull_errors += 1
                with self.lock:
                    self.pulled += len(jobs)
                    self.pull_latencies += [now - json.loads(j["Message"]["Payload"])["t"] for j in jobs]
            except (requests.RequestException, ValueError, KeyError):
                with self.lock:
                    self.pull_errors += 1
                time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between report lines")
    parser.add_argument("--pull-batch", type=int, default=50)
    parser.add_argument("--max-in-flight", type=int, default=None, help="push consumer's maxInFlight")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    args = smoke_args_parse(parser, seconds=3.0, rate=20.0, every=1.0)

    workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    receiver = Receiver()
    broker = Broker(args, workdir)
    load = None
    try:
        channel, _ = broker.setup_channel(1, receiver.port, args.max_in_flight)
        r = broker.session.put(f"{broker.url}/channel/{channel}/consumer/puller",
                               data={"token": "pull-token", "type": "pull"})
        assert r.status_code == 200, r.text
        time.sleep(2.0)  # dispatcher loops start
        receiver.ask("reset")
        postmaster = postmaster_pid(broker)
        print(f"soak: {args.seconds:.0f} s at {args.rate:.0f} msg/s, 1 push + 1 pull consumer, "
              f"{args.web_workers} web workers, {os.cpu_count()} CPUs, logs in {workdir}", flush=True)
        load = Load(broker.url, channel, args.rate, args.pull_batch)
        threads = [threading.Thread(target=load.publisher, daemon=True),
                   threading.Thread(target=load.puller, daemon=True)]
        for t in threads:
            t.start()
        start = last_t = time.monotonic()
        last = {"pub": 0, "push": 0, "pull": 0, "push_lat": 0, "pull_lat": 0}
        reports = []
        while time.monotonic() - start < args.seconds - 1e-6:
            time.sleep(max(0.0, min(args.every, start + args.seconds - time.monotonic(),
                                    last_t + args.every - time.monotonic())))
            now = time.monotonic()
            dt = now - last_t
            count, _, _, push_lat = receiver.ask("stats")
            with load.lock:
                pub, pull, pull_lat, errors = load.published, load.pulled, list(load.pull_latencies), load.publish_errors
            mem = memory(broker.web.pid, broker.workers.pid, postmaster)
            sizes = tables(broker.env["DATABASE_URL"])
            line = (f"t={now - start:5.0f}s publish {(pub - last['pub']) / dt:6.1f}/s (errors {errors}) "
                    f"push {(count - last['push']) / dt:6.1f}/s pull {(pull - last['pull']) / dt:6.1f}/s | "
                    f"latency ms push p50/p95/p99 "
                    + "/".join(f"{pct(push_lat[last['push_lat']:], p):.0f}" for p in (50, 95, 99))
                    + " pull " + "/".join(f"{pct(pull_lat[last['pull_lat']:], p):.0f}" for p in (50, 95, 99))
                    + f" | RSS MB web [{', '.join(f'{m:.0f}' for m in mem['web'])}]"
                    f" qcluster [{', '.join(f'{m:.0f}' for m in mem['qcluster'])}]"
                    f" postgres {mem['postgres']:.0f} PSS, {mem['pg_private']:.0f} private ({mem['pg_n']} procs)"
                    " | " + ", ".join(f"{name.split('_', 1)[1]} {rows} rows {mb:.1f} MB"
                                      for name, (rows, mb) in sizes.items()))
            print(line, flush=True)
            reports.append((mem, sizes))
            last = {"pub": pub, "push": count, "pull": pull, "push_lat": len(push_lat), "pull_lat": len(pull_lat)}
            last_t = now
        load.stop.set()
        if len(reports) >= 3:
            (m2, s2), (mn, sn) = reports[1], reports[-1]

            def growth(a: float, b: float) -> str:
                return f"{b - a:+.1f} MB ({100.0 * (b - a) / a if a else 0.0:+.1f}%)"

            web2, webn = sum(m2["web"]), sum(mn["web"])
            q2, qn = sum(m2["qcluster"]), sum(mn["qcluster"])
            pg2, pgn = m2["pg_private"] / max(1, m2["pg_n"]), mn["pg_private"] / max(1, mn["pg_n"])
            worst = max((b - a) / a for a, b in ((web2, webn), (q2, qn), (pg2, pgn)) if a)
            verdict = "stable" if worst < 0.10 else "GROWING (check for a leak)"
            print(f"verdict: RSS growth from the 2nd to the last report: web {growth(web2, webn)}, "
                  f"qcluster {growth(q2, qn)}, postgres PSS {growth(m2['postgres'], mn['postgres'])} "
                  f"(shared buffers filling), private per process {growth(pg2, pgn)} -> {verdict}; "
                  "history rows grew " + ", ".join(f"{name.split('_', 1)[1]} {sn[name][0] - s2[name][0]:+d}"
                                                   for name in HISTORY[:3])
                  + " (pruned by the archive job, not during a soak)", flush=True)
        else:
            print("verdict: too short for a verdict (needs 3 reports)")
        count = receiver.ask("count")
        problems = [f"{n} {what}" for n, what in ((load.publish_errors, "failed publishes"),
                                                  (load.pull_errors, "failed pull/ack requests")) if n]
        problems += [f"no {what}" for n, what in ((load.published, "publish"), (count, "push delivery"),
                                                  (load.pulled, "pulled job")) if not n]
    finally:
        if load is not None:
            load.stop.set()
        broker.stop()
        receiver.stop()
    if args.smoke:
        smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
