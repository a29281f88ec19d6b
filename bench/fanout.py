"""What each fan-out statement costs, straight through psycopg on one database (no HTTP).

The publish path runs one of two named statements (jobs/publish/queries.sql): ``insert_one`` for a
single message without a partition key, ``insert_messages`` (arrays) for a batch or keyed messages.
This times them alternately, prepared as the broker runs them, against a channel with
``--consumers`` pull consumers: one message through each, then batches of ``--batch`` plain and
keyed messages (every consumer has 10,000 partitions). Prints the median milliseconds per statement
and the ratio against ``insert_one`` (the single case) or the plain batch, same run.

    python bench/fanout.py [--singles 3000] [--batches 40] [--batch 1000] [--consumers 5]

Uses DATABASE_URL when set, else a throw-away embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (base_env, broker_database, django_setup, manage, registry_create,  # noqa: E402
                          sizes_add, smoke_args_parse)

SMOKE_TABLE = r"^case +ms/statement +ratio$(?s:.*)^batch of \d+, keyed +[\d.]+ +[\d.]+$"
PARTITIONS = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes_add(parser, singles=3000, batches=40, batch=1000, consumers=5)
    args = smoke_args_parse(parser, singles=20, batches=2, batch=50)
    with broker_database() as url:
        manage(base_env(url), "migrate", "-v0")
        django_setup(url)
        registry_create(channels=["fanout"], producers=["fanout"],
                        consumers=[("fanout", f"k{i}", "pull", "") for i in range(args.consumers)])
        import psycopg
        from psycopg.types.json import Jsonb

        from jobs.publish.queries import Q

        conn = psycopg.connect(url, autocommit=True)
        channel = conn.execute("SELECT id FROM broker_channel WHERE channel_id = 'fanout'").fetchone()[0]
        producer = conn.execute("SELECT id FROM broker_producer WHERE producer_id = 'fanout'").fetchone()[0]
        conn.execute("INSERT INTO jobs_partition (consumer_id, key) SELECT c.id, 'p' || g "
                     "FROM consumers_consumer c, generate_series(0, %s) g", [PARTITIONS - 1])

        def arrays(n: int, keyed: bool) -> dict:
            return {"channel": channel, "producer": producer, "mids": [uuid.uuid4().hex for _ in range(n)],
                    "payloads": [b'{"event": "order.created"}'] * n, "ctypes": ["application/json"] * n,
                    "prios": [0] * n, "headers": [Jsonb({})] * n, "types": [None] * n, "ttls": [None] * n,
                    "tps": [""] * n, "tss": [""] * n, "gates": [0] * n,
                    "pkeys": [f"p{i % PARTITIONS}" for i in range(n)] if keyed else [None] * n}

        def scalars() -> dict:
            return {"channel": channel, "producer": producer, "mid": uuid.uuid4().hex,
                    "payload": b'{"event": "order.created"}', "ctype": "application/json", "prio": 0,
                    "headers": Jsonb({}), "type": None, "ttl": None, "tp": "", "ts": ""}

        cases = {  # name -> (statement, parameters for one run)
            "one message, insert_one": (Q.insert_one, scalars),
            "one message, insert_messages": (Q.insert_messages, lambda: arrays(1, False)),
            f"batch of {args.batch}, plain": (Q.insert_messages, lambda: arrays(args.batch, False)),
            f"batch of {args.batch}, keyed": (Q.insert_messages, lambda: arrays(args.batch, True)),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for names, rounds in ((list(cases)[:2], args.singles), (list(cases)[2:], args.batches)):
            for _ in range(rounds):
                for name in names:  # alternately, so the table's growth weighs on each alike
                    query, params = cases[name]
                    values = params()
                    started = time.perf_counter()
                    conn.execute(query.sql, values, prepare=True)
                    times[name].append(time.perf_counter() - started)
        conn.close()
    medians = {name: statistics.median(values) * 1000 for name, values in times.items()}
    baselines = {name: medians[list(cases)[0] if name.startswith("one") else list(cases)[2]] for name in cases}
    print(f"fan-out statements: {args.consumers} pull consumers, prepared, medians of {args.singles} single "
          f"and {args.batches} batch statements")
    print(f"{'case':<36} {'ms/statement':>12} {'ratio':>7}")
    for name, ms in medians.items():
        print(f"{name:<36} {ms:>12.3f} {ms / baselines[name]:>7.2f}")


if __name__ == "__main__":
    main()
