"""Inbound sources under load: GitHub-signed webhooks to ``/in/{id}``, every delivery sent twice.

    .venv/bin/python bench/sources.py                          # 1,000 requests/s for 60 s
    .venv/bin/python bench/sources.py --rate 400 --seconds 30  # what a shared machine holds
    .venv/bin/python bench/sources.py --smoke                  # a few seconds (CI)

Everything runs on this machine as a user runs it: PostgreSQL (a throw-away embedded server, fsync
on; or DATABASE_URL), gunicorn and qcluster (bench.push.Broker), a push receiver answering 204 at
once (its own process) and the provider (its own process). One channel with a source
(``verify=github``: each request carries a valid ``X-Hub-Signature-256`` and its own
``X-GitHub-Delivery``), one push consumer and one pull consumer (batches of up to 500, acked with
their Receipt).

The provider is open-loop: a ticker hands out one request slot every 1/rate s to ``--connections``
keep-alive connections, and each delivery takes two slots in a row (the same body, signature and
delivery id: a redelivery, as providers make them); a slot waits when every connection is busy, and
its time to answer counts from the slot (no coordinated omission). ``--rate`` counts requests, so
half as many messages are expected. Printed: the achieved request rate, the time to answer p50/p99,
the answers by status, the CPU milliseconds per request of web (gunicorn), workers (qcluster),
PostgreSQL (embedded), the provider and the receiver (from /proc), then per consumer the deliveries
lost (a delivery answered 2xx that never arrived) and duplicated (a delivery that arrived twice),
and provider-to-consumer latency p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (NO_CONTENT, KeepAlive, build_request, commands_serve, head_header, parts_stop,  # noqa: E402
                          percentile, pull_consumer_run, receiver_serve, smoke_args_parse, smoke_problems_exit)
from bench.capacity import CHANNEL_TOKEN, PULL_TOKEN, PULLER, channel_create  # noqa: E402
from bench.push import Broker, cpu_by_group  # noqa: E402

SMOKE_TABLE = (r"^rate +\d+ requests/s: achieved [\d.]+/s .* answer p50/p99 [\d.]+/[\d.]+ ms .*\n"
               r" +CPU ms/request: web [\d.]+, .*\n +push: lost \d+ dup \d+ .*\n +pull: lost \d+ dup \d+ ")
CHANNEL, SOURCE = "sources-bench", "github"
SECRET = "bench-github-secret"
PAD = "x" * 400  # a small GitHub event is ~0.5 kB


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the push consumer: counts deliveries by X-Broker-Source-Delivery (its own process) -------------

def _receiver_main(port: int, conn) -> None:
    seen: list[int] = []
    latencies: list[float] = []

    def answer(head: bytes, body: bytes) -> bytes:
        """204 at once; a delivery counted by its X-Broker-Source-Delivery, with its latency."""
        delivery = head_header(head, b"x-broker-source-delivery")
        if delivery is not None:
            seen.append(int(delivery[2:]))
            try:
                latencies.append(time.time() - json.loads(body)["t"])
            except (ValueError, KeyError):
                pass
        return NO_CONTENT

    def control():
        while True:
            cmd = conn.recv()[0]
            if cmd == "seen":
                conn.send((list(seen), list(latencies)))
            elif cmd == "reset":
                seen.clear()
                latencies.clear()
                conn.send(True)

    receiver_serve(port, conn, control, answer)


# --- the provider and the pull consumer (one process, one event loop) ------------------------------

def _provider_main(url: str, source_id: str, connections: int, pull_batch: int, conn) -> None:
    host, port = url.split("//")[1].split(":")
    port = int(port)
    pulled: list[int] = []
    pull_lat: list[float] = []
    pull_errors = [0]

    def taken(jobs: list[dict], now: float) -> None:
        """Each pulled job's delivery number (its X-GitHub-Delivery) and provider-to-pull latency."""
        for job in jobs:
            pulled.append(int(job["Message"]["SourceDelivery"][2:]))
            pull_lat.append(now - json.loads(job["Message"]["Payload"])["t"])

    def request(seq: int, sent: float) -> bytes:
        body = json.dumps({"ref": "refs/heads/main", "i": seq, "t": sent, "pad": PAD}).encode()
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        return build_request("POST", f"/in/{source_id}", {
            "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench", "X-GitHub-Event": "push",
            "X-GitHub-Delivery": f"d-{seq}", "X-GitHub-Hook-ID": "1", "X-Hub-Signature-256": signature}, body)

    async def provide(rate: float, seconds: float, first: int) -> dict:
        """Open-loop requests at ``rate`` for ``seconds``, each delivery in two consecutive slots."""
        queue: asyncio.Queue = asyncio.Queue()
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        ok: set[int] = set()

        async def ticker() -> None:
            start = time.perf_counter()
            wall = time.time() - start
            raw = b""
            for n in range(int(rate * seconds)):
                due = start + n / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                seq = first + n // 2
                if n % 2 == 0:  # the delivery; the next slot sends it again
                    raw = request(seq, wall + due)
                queue.put_nowait((seq, due, raw))
            for _ in range(connections):
                queue.put_nowait(None)

        async def sender() -> None:
            connection = KeepAlive(host, port)
            while (item := await queue.get()) is not None:
                seq, due, raw = item
                status = await connection.exchange(raw)
                latencies.append(time.perf_counter() - due)
                statuses[status] = statuses.get(status, 0) + 1
                if 200 <= status < 300:
                    ok.add(seq)
            connection.close()

        started = time.perf_counter()
        await asyncio.gather(ticker(), *(sender() for _ in range(connections)))
        return {"seconds": time.perf_counter() - started, "latencies": latencies, "statuses": statuses,
                "ok": sorted(ok), "sent": len(latencies)}

    async def answer(cmd: tuple):
        """What ``Child.ask`` gets back."""
        if cmd[0] == "provide":
            return await provide(*cmd[1:])
        if cmd[0] == "pulled":
            return list(pulled), list(pull_lat), pull_errors[0]

    puller = pull_consumer_run(url, channel=CHANNEL, consumer=PULLER, channel_token=CHANNEL_TOKEN,
                               consumer_token=PULL_TOKEN, batch=pull_batch, expires=5, taken=taken,
                               errors=pull_errors)
    asyncio.run(commands_serve(conn, answer, beside=puller))


class Child:
    """A function in its own process, spoken to over a pipe."""

    def __init__(self, target, *args) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=target, args=(*args, child), daemon=True)
        self.proc.start()

    def ask(self, *cmd):
        self.conn.send(cmd)
        return self.conn.recv()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join(5)


def setup(broker: Broker, receiver_port: int, max_in_flight: int) -> str:
    """The channel and its two consumers as bench/capacity.py makes them, and the source; its ID."""
    channel_create(broker, receiver_port, max_in_flight, channel=CHANNEL)
    r = broker.session.put(f"{broker.url}/channel/{CHANNEL}/source/{SOURCE}",
                           json={"verify": "github", "secret": SECRET})
    assert r.status_code == 201, r.text
    return r.json()["ID"]


def cpu_groups(broker: Broker, receiver: Child, provider: Child) -> dict:
    """The processes whose CPU is counted (bench.push.cpu_by_group): PostgreSQL when embedded here."""
    groups = {"web": ("pgrp", broker.web.pid), "workers": ("pgrp", broker.workers.pid),
              "provider": ("children", provider.proc.pid), "receiver": ("children", receiver.proc.pid)}
    if broker.server_dir is not None:
        try:
            groups["postgres"] = ("children", int((broker.server_dir / "pgdata" / "postmaster.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return groups


def run(broker: Broker, receiver: Child, provider: Child, *, rate: float, seconds: float, first: int,
        drain: float) -> dict:
    receiver.ask("reset")
    groups = cpu_groups(broker, receiver, provider)
    cpu0 = cpu_by_group(groups)
    result = provider.ask("provide", rate, seconds, first)
    cpu1 = cpu_by_group(groups)
    ok = set(result["ok"])
    deadline = time.monotonic() + drain
    while True:
        pushed, push_lat = receiver.ask("seen")
        pulled, pull_lat, pull_errors = provider.ask("pulled")
        pushed = [s for s in pushed if s >= first]
        pulled = [s for s in pulled if s >= first]
        if (ok <= set(pushed) and ok <= set(pulled)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = {
        "rate": rate, "achieved": result["sent"] / result["seconds"], "deliveries": len(ok),
        "statuses": result["statuses"], "failed": sum(n for k, n in result["statuses"].items() if not 200 <= k < 300),
        "answer": [1000 * percentile(result["latencies"], p) for p in (50, 99)],
        "push": {"lost": len(ok - set(pushed)), "dup": len(pushed) - len(set(pushed)),
                 "extra": len(set(pushed) - ok), "lat": [1000 * percentile(push_lat, p) for p in (50, 99)]},
        "pull": {"lost": len(ok - set(pulled)), "dup": len(pulled) - len(set(pulled)),
                 "extra": len(set(pulled) - ok), "lat": [1000 * percentile(pull_lat, p) for p in (50, 99)],
                 "errors": pull_errors},
    }
    print(f"rate {rate:5.0f} requests/s: achieved {out['achieved']:.1f}/s ({result['sent']} requests, "
          f"{out['deliveries']} deliveries each sent twice) | answer p50/p99 {out['answer'][0]:.1f}/"
          f"{out['answer'][1]:.1f} ms | statuses {out['statuses']}", flush=True)
    per = max(1, result["sent"])
    print("          CPU ms/request: " + ", ".join(f"{name} {1000 * (cpu1[name] - cpu0[name]) / per:.2f}"
                                                 for name in groups), flush=True)
    for name in ("push", "pull"):
        c = out[name]
        print(f"          {name}: lost {c['lost']} dup {c['dup']} (unexpected {c['extra']}) | provider to consumer "
              f"p50/p99 {c['lat'][0]:.0f}/{c['lat'][1]:.0f} ms"
              + (f" | pull/ack errors {c['errors']}" if name == "pull" else ""), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second (each delivery twice)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=64, help="the provider's keep-alive connections")
    parser.add_argument("--pull-batch", type=int, default=500)
    parser.add_argument("--max-in-flight", type=int, default=50)
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait for the last deliveries")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--no-fsync", action="store_true", help="embedded server with fsync off")
    args = smoke_args_parse(parser, rate=40.0, seconds=3.0, connections=4, drain=30.0)

    workdir = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    receiver_port = _free_port()
    receiver = Child(_receiver_main, receiver_port)
    assert receiver.conn.recv() == "ready"
    broker = Broker(args, workdir)
    provider = None
    problems: list[str] = []
    try:
        source_id = setup(broker, receiver_port, args.max_in_flight)
        provider = Child(_provider_main, broker.url, source_id, args.connections, args.pull_batch)
        print(f"sources: {os.cpu_count()} CPUs, verify=github, every delivery sent twice, 1 push consumer "
              f"(maxInFlight {args.max_in_flight}) + 1 pull consumer (batch {args.pull_batch}), {args.connections} "
              f"provider connections, {args.web_workers} web workers; logs in {workdir}", flush=True)
        time.sleep(3.0)  # dispatcher loops start, the puller's first long poll
        out = run(broker, receiver, provider, rate=args.rate, seconds=args.seconds, first=0, drain=args.drain)
        problems += [f"{n} {what}" for n, what in (
            (out["failed"], "requests not answered 2xx"), (out["push"]["lost"], "push deliveries lost"),
            (out["pull"]["lost"], "pull deliveries lost"), (out["push"]["dup"], "push deliveries duplicated"),
            (out["pull"]["dup"], "pull deliveries duplicated"), (out["pull"]["errors"], "pull/ack errors")) if n]
        if not out["deliveries"]:
            problems.append("nothing accepted")
    finally:
        parts_stop(provider, broker, receiver)
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
