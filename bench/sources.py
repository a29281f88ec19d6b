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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import _read_response, build_request, percentile, smoke_args_parse, smoke_problems_exit  # noqa: E402
from bench.push import Broker, cpu_by_group  # noqa: E402

SMOKE_TABLE = (r"^rate +\d+ requests/s: achieved [\d.]+/s .* answer p50/p99 [\d.]+/[\d.]+ ms .*\n"
               r" +CPU ms/request: web [\d.]+, .*\n +push: lost \d+ dup \d+ .*\n +pull: lost \d+ dup \d+ ")
CHANNEL, SOURCE, PUSHER, PULLER = "sources-bench", "github", "pusher", "puller"
CHANNEL_TOKEN, PULL_TOKEN = "bench-c", "pull-token"
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

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.buf = b""

        def data_received(self, data):
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].lower()
                i = head.find(b"\r\ncontent-length:")
                length = int(head[i + 17:head.find(b"\r\n", i + 2) if head.find(b"\r\n", i + 2) > 0 else None]) if i >= 0 else 0
                if len(self.buf) < end + 4 + length:
                    return
                body = self.buf[end + 4:end + 4 + length]
                self.buf = self.buf[end + 4 + length:]
                j = head.find(b"\r\nx-broker-source-delivery:")
                if j >= 0:
                    k = head.find(b"\r\n", j + 2)
                    seen.append(int(head[j + 27:k if k > 0 else None].strip()[2:]))
                    try:
                        latencies.append(time.time() - json.loads(body)["t"])
                    except (ValueError, KeyError):
                        pass
                self.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    def control():
        while True:
            cmd = conn.recv()[0]
            if cmd == "seen":
                conn.send((list(seen), list(latencies)))
            elif cmd == "reset":
                seen.clear()
                latencies.clear()
                conn.send(True)

    async def main():
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", port, backlog=1024)
        threading.Thread(target=control, daemon=True).start()
        conn.send("ready")
        await server.serve_forever()

    asyncio.run(main())


# --- the provider and the pull consumer (one process, one event loop) ------------------------------

def _provider_main(url: str, source_id: str, connections: int, pull_batch: int, conn) -> None:
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
                    pulled.append(int(job["Message"]["SourceDelivery"][2:]))
                    pull_lat.append(now - json.loads(job["Message"]["Payload"])["t"])
                ack = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED", "Receipt": j["Receipt"]} for j in jobs]}
                writer.write(build_request("POST", f"{base}/ack", headers, json.dumps(ack).encode()))
                status, _, body = await _read_response(reader)
                results = json.loads(body).get("Result", []) if status == 200 else []
                pull_errors[0] += (status != 200) + sum(1 for r in results if r.get("Error"))
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError):
                pull_errors[0] += 1
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.2)

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
            reader = writer = None
            while (item := await queue.get()) is not None:
                seq, due, raw = item
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(host, port)
                    writer.write(raw)
                    status, _, _ = await asyncio.wait_for(_read_response(reader), 60)
                except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                latencies.append(time.perf_counter() - due)
                statuses[status] = statuses.get(status, 0) + 1
                if 200 <= status < 300:
                    ok.add(seq)
            if writer is not None:
                writer.close()

        started = time.perf_counter()
        await asyncio.gather(ticker(), *(sender() for _ in range(connections)))
        return {"seconds": time.perf_counter() - started, "latencies": latencies, "statuses": statuses,
                "ok": sorted(ok), "sent": len(latencies)}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pulling = loop.create_task(puller())
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd[0] == "provide":
                conn.send(await provide(*cmd[1:]))
            elif cmd[0] == "pulled":
                conn.send((list(pulled), list(pull_lat), pull_errors[0]))
            elif cmd[0] == "stop":
                pulling.cancel()
                conn.send(True)
                return

    asyncio.run(main())


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
    s = broker.session
    assert s.put(f"{broker.url}/channel/{CHANNEL}", data={"token": CHANNEL_TOKEN}).status_code == 200
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/{PUSHER}",
              data={"token": "t0", "callbackUrl": f"http://127.0.0.1:{receiver_port}/{PUSHER}",
                    "maxInFlight": str(max_in_flight)})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{CHANNEL}/consumer/{PULLER}", data={"token": PULL_TOKEN, "type": "pull"})
    assert r.status_code == 200, r.text
    r = s.put(f"{broker.url}/channel/{CHANNEL}/source/{SOURCE}", json={"verify": "github", "secret": SECRET})
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
    parser.add_argument("--web-workers", type=int, default=2)
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
        if provider is not None:
            provider.stop()
        broker.stop()
        receiver.stop()
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
