"""Scale-out on one machine: 1, then 2 web + worker process pairs against the same database.

    .venv/bin/python bench/scale.py                       # throw-away embedded PostgreSQL
    .venv/bin/python bench/scale.py --messages 8000 --pairs 1,2,3
    DATABASE_URL=postgres://... .venv/bin/python bench/scale.py

A pair is what one node of docs/multi-node.md runs: one gunicorn (``--web-workers`` workers, 16
threads) and one ``qcluster`` (2 django-q2 workers: one push dispatcher loop), each cluster under
its own ``BROKER_Q_CLUSTER_NAME`` so every node runs its own dispatcher loop. The same load
generator runs for every pair count:

- publish: ``--messages`` single-message broadcasts over ``--concurrency`` keep-alive connections,
  spread evenly over the pairs' web servers, while the push consumers are paused (so publishing is
  measured alone) -> messages/s;
- push: the consumers are resumed and the backlog is delivered to a loopback receiver (its own
  process, answering 204) -> deliveries/s, from resume to the last callback.

Prints both for each pair count and the ratio against one pair. Expect little gain on a 2-core
machine: the load generator, the receiver, PostgreSQL and the broker share the same two cores.
Everything is on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (ADMIN, base_env, broker_database, build_request, manage, run_load,  # noqa: E402
                          smoke_args_parse, smoke_problems_exit, start_gunicorn)
from bench.push import Receiver  # noqa: E402

PAYLOAD = json.dumps({"event": "order.created", "id": 12345, "note": "x" * 200}).encode()
SMOKE_TABLE = r"^\d pair\(s\): publish [\d,]+ msg/s .* push [\d,]+ deliveries/s .*; load average [\d.]+$"
HEADERS = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "scale", "X-Broker-Producer-Token": "pt",
           "Content-Type": "application/json"}


def start_qcluster(env: dict, name: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT,
                            env={**env, "BROKER_Q_CLUSTER_NAME": name, "BROKER_Q_WORKERS": "2",
                                 "BROKER_PUSH_DISPATCHERS": "1"},
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def kill(popen: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL the process group (qcluster can hang on SIGTERM: django-q2 #346)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            return
        try:
            popen.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


async def publish_all(urls: list[str], channel: str, total: int, concurrency: int) -> tuple[float, dict]:
    run = uuid.uuid4().hex[:8]
    share = total // len(urls)
    per_url = max(1, concurrency // len(urls))

    def maker(k: int):
        def make(i: int) -> bytes:
            return build_request("POST", f"/channel/{channel}/broadcast",
                                 {**HEADERS, "X-Broker-Message-ID": f"{run}-{k}-{i}"}, PAYLOAD)
        return make

    start = time.perf_counter()
    results = await asyncio.gather(*(run_load(url, maker(k), share, per_url) for k, url in enumerate(urls)))
    statuses: dict = {}
    for _, s, _ in results:
        for code, n in s.items():
            statuses[code] = statuses.get(code, 0) + n
    return time.perf_counter() - start, statuses


def run_pairs(env: dict, pairs: int, args, receiver: Receiver, workdir: Path) -> dict:
    webs, clusters = [], []
    try:
        for i in range(pairs):
            webs.append(start_gunicorn(env, workers=args.web_workers, threads=16))
            clusters.append(start_qcluster(env, f"scale-{pairs}-{i}", workdir / f"qcluster-{pairs}-{i}.log"))
        urls = [w.url for w in webs]
        admin = requests.Session()
        admin.headers["X-Broker-Admin-Token"] = ADMIN
        channel = f"scale-{pairs}-{uuid.uuid4().hex[:6]}"
        admin.put(f"{urls[0]}/channel/{channel}", data={"token": "ct"}).raise_for_status()
        for c in range(args.consumers):
            admin.put(f"{urls[0]}/channel/{channel}/consumer/c{c}",
                      data={"token": "t", "maxInFlight": str(args.max_in_flight),
                            "callbackUrl": f"http://127.0.0.1:{receiver.port}/{channel}/c{c}"}).raise_for_status()
            admin.post(f"{urls[0]}/channel/{channel}/consumer/c{c}/pause").raise_for_status()
        time.sleep(3.0)  # dispatcher loops start
        elapsed, statuses = asyncio.run(publish_all(urls, channel, args.messages, args.concurrency))
        published = statuses.get(201, 0)
        receiver.ask("reset")
        expected = published * args.consumers
        start = time.time()
        for c in range(args.consumers):
            admin.post(f"{urls[0]}/channel/{channel}/consumer/c{c}/resume").raise_for_status()
        deadline = time.monotonic() + max(120.0, expected / 100.0)
        while receiver.ask("count") < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        count, _, last, _ = receiver.ask("stats")
        return {"pairs": pairs, "publish_per_s": published / elapsed, "statuses": statuses,
                "deliveries": count, "expected": expected,
                "push_per_s": count / max(1e-9, (last or start) - start)}
    finally:
        for c in clusters:
            kill(c)
        for w in webs:
            w.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="1,2", help="pair counts to run, comma-separated")
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=16, help="publishing connections in all")
    parser.add_argument("--consumers", type=int, default=2, help="push consumers on the channel")
    parser.add_argument("--max-in-flight", type=int, default=100, help="push consumers' maxInFlight")
    parser.add_argument("--web-workers", type=int, default=1, help="gunicorn workers per pair")
    args = smoke_args_parse(parser, pairs="2", messages=200, concurrency=4)
    problems = []  # counted failures, fatal in --smoke

    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    receiver = Receiver()
    try:
        with broker_database() as url:
            env = base_env(url)
            manage(env, "migrate", "-v0")
            print(f"scale: {os.cpu_count()} CPUs, {args.messages} messages, {args.consumers} push consumers "
                  f"(maxInFlight {args.max_in_flight}), {args.web_workers} gunicorn worker(s) + 1 qcluster "
                  f"(1 dispatcher loop) per pair, logs in {workdir}", flush=True)
            web = start_gunicorn(env, workers=1, threads=4)
            try:
                r = requests.put(f"{web.url}/producer/scale", data={"token": "pt"},
                                 headers={"X-Broker-Admin-Token": ADMIN})
                assert r.status_code in (200, 201), r.text
            finally:
                web.stop()
            results = []
            for pairs in [int(x) for x in args.pairs.split(",") if x.strip()]:
                result = run_pairs(env, pairs, args, receiver, workdir)
                results.append(result)
                base = results[0]
                print(f"{pairs} pair(s): publish {result['publish_per_s']:,.0f} msg/s "
                      f"(x{result['publish_per_s'] / base['publish_per_s']:.2f}; statuses {result['statuses']}), "
                      f"push {result['push_per_s']:,.0f} deliveries/s "
                      f"(x{result['push_per_s'] / base['push_per_s']:.2f}; {result['deliveries']}/{result['expected']}); "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
                if set(result["statuses"]) != {201} or not 0 < result["deliveries"] == result["expected"]:
                    problems.append(f"{pairs} pair(s): publish statuses {result['statuses']}, "
                                    f"{result['deliveries']}/{result['expected']} deliveries")
    finally:
        receiver.stop()
    if args.smoke:
        smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
