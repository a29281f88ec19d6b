"""What type filters cost publishing (issue 17: at most 1.2x): single broadcasts over HTTP against
gunicorn (2 workers, as users run it) to a channel with 50 consumers without filters and to one
with 50 consumers that each hold several patterns, every message matching all of them (the same
50 jobs per message, so the only difference is the filter in the fan-out statement). Rounds
alternate between the two channels and the median of each is compared, so load on the machine
hits both alike. A third row shows a type that matches 10 of the 50 filtered consumers (fewer
jobs: cheaper).

    python bench/filters.py [--messages 2000] [--rounds 5] [--concurrency 16] [--consumers 50]

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from bench.common import ADMIN, broker_served, smoke_args_parse  # noqa: E402
from bench.publish import single  # noqa: E402

SMOKE_TABLE = r"^case +msg/s +ratio$(?s:.*)^\d+ consumers, filtered, type matching 10 +\d+ +[\d.]+$"
MATCH_ALL_TYPE = "order.created"


def patterns_for(i: int) -> str:
    """Several patterns per consumer; every one matches ``order.created`` through one of them (a
    prefix, an exact type or ``order.*``), and consumers 0-9 also match ``audit.<n>`` types."""
    own = f"tenant{i}.*,billing.refund.partial,user{i}.signup"
    match = ("order.*", "order.created", f"order.created.v{i}.*,order.created")[i % 3]
    extra = ",audit.*" if i < 10 else ""
    return f"{own},{match}{extra}"


def setup(url: str, channel: str, consumers: int, filtered: bool) -> None:
    admin = {"X-Broker-Admin-Token": ADMIN}
    requests.put(f"{url}/channel/{channel}", data={"token": "ct"}, headers=admin).raise_for_status()
    if requests.get(f"{url}/producer/bench", headers=admin).status_code == 404:
        requests.put(f"{url}/producer/bench", data={"token": "pt"}, headers=admin).raise_for_status()
    for i in range(consumers):
        data = {"token": "t", "type": "pull"}
        if filtered:
            data["messageTypes"] = patterns_for(i)
        requests.put(f"{url}/channel/{channel}/consumer/c{i}", data=data, headers=admin).raise_for_status()


def jobs_per_message(url: str, channel: str) -> float:
    """Jobs created per message on the channel, from messages-status (maintained counters)."""
    body = requests.get(f"{url}/channel/{channel}/messages-status", headers={"X-Broker-Admin-Token": ADMIN}).json()
    messages = sum(v["Count"] for k, v in body["counts"].items() if not k.startswith("SCHEDULED"))
    jobs = sum(sum(per.values()) for per in body["consumers"].values())
    return jobs / max(messages, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per round and case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = smoke_args_parse(parser, messages=100, rounds=1, concurrency=4)
    with broker_served(workers=args.workers) as (server, _database_url):
        setup(server.url, "plain", args.consumers, filtered=False)
        setup(server.url, "filtered", args.consumers, filtered=True)
        setup(server.url, "partial", args.consumers, filtered=True)
        typed = {"plain": MATCH_ALL_TYPE, "filtered": MATCH_ALL_TYPE, "partial": "audit.login"}
        for channel in ("plain", "filtered"):  # warm-up: connections, prepared statements
            single(server.url, channel, min(200, args.messages), args.concurrency,
                   {"X-Broker-Message-Type": typed[channel]})
        rates: dict[str, list[float]] = {channel: [] for channel in typed}
        for _ in range(args.rounds):  # alternating, so load on the machine hits every case alike
            for channel, message_type in typed.items():
                rates[channel].append(single(server.url, channel, args.messages, args.concurrency,
                                             {"X-Broker-Message-Type": message_type}))
        fanout = {channel: jobs_per_message(server.url, channel) for channel in rates}
    plain = statistics.median(rates["plain"])
    print(f"filters benchmark: gunicorn {args.workers} workers, concurrency {args.concurrency}, "
          f"{args.rounds} alternating rounds of {args.messages} single broadcasts, medians")
    print(f"jobs per message: plain {fanout['plain']:.1f}, filtered {fanout['filtered']:.1f}, "
          f"partial {fanout['partial']:.1f}")
    print(f"{'case':50} {'msg/s':>9} {'ratio':>7}")
    n = args.consumers
    for name, key in ((f"{n} consumers, no filters", "plain"),
                      (f"{n} consumers, filtered, type matching all", "filtered"),
                      (f"{n} consumers, filtered, type matching 10", "partial")):
        rate = statistics.median(rates[key])
        print(f"{name:50} {rate:9.0f} {plain / rate:7.2f}")
    print("ratio: time per publish relative to no filters (issue 17: filtered, matching all, <= 1.2)")
    if fanout["filtered"] != fanout["plain"]:
        print(f"FAILED: filtered channel created {fanout['filtered']} jobs per message, expected {fanout['plain']}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
