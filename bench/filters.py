"""What filters cost publishing: type filters (issue 17: at most 1.2x) and content filters (issue
25: at most 1.3x). Single broadcasts over HTTP against gunicorn (2 workers, as users run it) to a
channel with 50 consumers without filters, to one with 50 consumers that each hold several type
patterns, and to one with 50 consumers that each hold a content filter (body paths with operators,
a header, an ``$or``), every message matching all of them (the same 50 jobs per message, so the
only difference is the filter in the fan-out statement). Every request carries the same headers
(type, one stored metadata header), so only the filters differ. Rounds alternate between the
channels and the median of each is compared, so load on the machine hits all alike. Two more rows
show a type and a payload that match 10 of the 50 filtered consumers (fewer jobs: cheaper).

    python bench/filters.py [--messages 2000] [--rounds 5] [--concurrency 16] [--consumers 50]

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from bench.common import ADMIN, broker_served, sizes_add, smoke_args_parse, smoke_problems_exit  # noqa: E402
from bench.publish import PAYLOAD, single  # noqa: E402

SMOKE_TABLE = (r"^case +msg/s +ratio$(?s:.*)^\d+ consumers, filtered, type matching 10 +\d+ +[\d.]+$"
               r"(?s:.*)^\d+ consumers, content filters, matching all +\d+ +[\d.]+$")
MATCH_ALL_TYPE = "order.created"
TENANT = {"X-Tenant": "acme", "X-Broker-Metadata-Headers": "X-Tenant"}
PARTIAL_PAYLOAD = json.dumps({"event": "order.created", "id": 5, "items": [1, 2, 3], "note": "x" * 200}).encode()


def patterns_for(i: int) -> str:
    """Several patterns per consumer; every one matches ``order.created`` through one of them (a
    prefix, an exact type or ``order.*``), and consumers 0-9 also match ``audit.<n>`` types."""
    own = f"tenant{i}.*,billing.refund.partial,user{i}.signup"
    match = ("order.*", "order.created", f"order.created.v{i}.*,order.created")[i % 3]
    extra = ",audit.*" if i < 10 else ""
    return f"{own},{match}{extra}"


def content_filter_for(i: int) -> dict:
    """A content filter per consumer (a few conditions each, as users write them): every one matches
    bench/publish.py's PAYLOAD (id 12345, event order.created, tenant acme); consumers 0-9 also
    match PARTIAL_PAYLOAD (id 5), the others do not."""
    return {"body": {"event": {"$startsWith": "order."}, "id": {"$gte": 100 if i >= 10 else 1},
                     "items.0": {"$in": [1, 7, i]}, "$or": [{"note": {"$exists": True}}, {"vip": True}]},
            "headers": {"x-tenant": {"$ne": f"other{i}"}}}


def setup(url: str, channel: str, consumers: int, filtered: bool | str) -> None:
    admin = {"X-Broker-Admin-Token": ADMIN}
    requests.put(f"{url}/channel/{channel}", data={"token": "ct"}, headers=admin).raise_for_status()
    if requests.get(f"{url}/producer/bench", headers=admin).status_code == 404:
        requests.put(f"{url}/producer/bench", data={"token": "pt"}, headers=admin).raise_for_status()
    for i in range(consumers):
        data = {"token": "t", "type": "pull"}
        if filtered == "content":
            data["filter"] = json.dumps(content_filter_for(i))
        elif filtered:
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
    sizes_add(parser, messages=(2000, "messages per round and case"), rounds=5, concurrency=16, consumers=50,
              workers=2)
    args = smoke_args_parse(parser, messages=100, rounds=1, concurrency=4)
    with broker_served(workers=args.workers) as (server, _database_url):
        setup(server.url, "plain", args.consumers, filtered=False)
        setup(server.url, "filtered", args.consumers, filtered=True)
        setup(server.url, "partial", args.consumers, filtered=True)
        setup(server.url, "content", args.consumers, filtered="content")
        setup(server.url, "content10", args.consumers, filtered="content")
        typed = {"plain": MATCH_ALL_TYPE, "filtered": MATCH_ALL_TYPE, "partial": "audit.login",
                 "content": MATCH_ALL_TYPE, "content10": MATCH_ALL_TYPE}
        payloads = {"content10": PARTIAL_PAYLOAD}
        for channel in ("plain", "filtered", "content"):  # warm-up: connections, prepared statements
            single(server.url, channel, min(200, args.messages), args.concurrency,
                   {"X-Broker-Message-Type": typed[channel], **TENANT})
        rates: dict[str, list[float]] = {channel: [] for channel in typed}
        for _ in range(args.rounds):  # alternating, so load on the machine hits every case alike
            for channel, message_type in typed.items():
                rates[channel].append(single(server.url, channel, args.messages, args.concurrency,
                                             {"X-Broker-Message-Type": message_type, **TENANT},
                                             payload=payloads.get(channel, PAYLOAD)))
        fanout = {channel: jobs_per_message(server.url, channel) for channel in rates}
    plain = statistics.median(rates["plain"])
    print(f"filters benchmark: gunicorn {args.workers} workers, concurrency {args.concurrency}, "
          f"{args.rounds} alternating rounds of {args.messages} single broadcasts, medians")
    print(f"jobs per message: plain {fanout['plain']:.1f}, filtered {fanout['filtered']:.1f}, "
          f"partial {fanout['partial']:.1f}, content {fanout['content']:.1f}, content10 {fanout['content10']:.1f}")
    print(f"{'case':50} {'msg/s':>9} {'ratio':>7}")
    n = args.consumers
    for name, key in ((f"{n} consumers, no filters", "plain"),
                      (f"{n} consumers, filtered, type matching all", "filtered"),
                      (f"{n} consumers, filtered, type matching 10", "partial"),
                      (f"{n} consumers, content filters, matching all", "content"),
                      (f"{n} consumers, content filters, matching 10", "content10")):
        rate = statistics.median(rates[key])
        print(f"{name:50} {rate:9.0f} {plain / rate:7.2f}")
    print("ratio: time per publish relative to no filters (issue 17: type filters matching all <= 1.2; "
          "issue 25: content filters matching all <= 1.3)")
    expected = {"filtered": fanout["plain"], "content": fanout["plain"], "content10": min(10, n)}
    problems = [f"{channel} channel created {fanout[channel]} jobs per message, expected {want}"
                for channel, want in expected.items() if fanout[channel] != want]
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
