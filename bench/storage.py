"""The job storage under a long reader: what the engine's statements cost per message, before, while
and after another session holds a REPEATABLE READ snapshot (issue 35).

    .venv/bin/python bench/storage.py                       # 300 cycles each phase, snapshot held throughout phase 2
    .venv/bin/python bench/storage.py --cycles 600 --hold-cycles 3000
    .venv/bin/python bench/storage.py --smoke

No HTTP, no scheduler: this process drives the engine's own services in a fixed mix that stands for
a tenth of a second at 300 messages/s: four grouped publishes of --per-publish messages (one
channel, a push and a pull consumer), two push claims and records (every job delivered), a pull
claim and ack every other cycle, the housekeeping steps at their periods in cycles (timeout and
expiry sweeps every 10, counter compaction every 50, retention every 50 with a channel retention of
--retention seconds). The work is the same in every phase, so the phases compare by what the
database did for it, read from pg_stat_statements (shared buffers touched, execution time) and
/proc (the CPU of every server process, autovacuum's included): buffers are deterministic, which
makes A/B runs meaningful on a busy machine; times and CPU are the user's figures on a quiet one.

Phases: ``baseline`` (--cycles), ``held`` (--hold-cycles, a snapshot held by a connection that read
jobs_job and broker_message and sits idle in its transaction), ``released`` (--cycles). Printed per
phase: database ms and CPU ms per message, buffers per message, dead tuples and size at its end,
and the statements that touched the most buffers; then the ratios held/baseline and
released/baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import django_setup, registry_create, smoke_args_parse, smoke_problems_exit  # noqa: E402

SMOKE_TABLE = (r"^phase +baseline: .* db [\d.]+ ms/msg, CPU [\d.]+ ms/msg, [\d.]+ buffers/msg.*\n(?s:.*)"
               r"^ratio held/baseline: .*")
CHANNEL, PRODUCER, PUSH, PULL = "store", "store-p", "store-push", "store-pull"


class Server:
    """The broker's PostgreSQL, watched: its statements and its processes' CPU."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        backend = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with open(f"/proc/{backend}/stat") as fh:
            self.postmaster = int(fh.read().rsplit(")", 1)[1].split()[1])

    def cpu(self) -> float:
        """CPU seconds of the server's processes so far (live ones, and the ended ones waited for)."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for pid in [self.postmaster] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if pid == self.postmaster:
                total += sum(int(x) for x in fields[11:15]) / tick  # its own and its reaped children's
            elif int(fields[1]) == self.postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def statements(self) -> dict[str, tuple[int, float, int]]:
        rows = self.conn.execute(
            "SELECT regexp_replace(left(query, 110), '\\s+', ' ', 'g'), calls, total_exec_time + total_plan_time,"
            "       shared_blks_hit + shared_blks_read + shared_blks_dirtied"
            "  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "   AND query NOT LIKE '%pg_stat_statements%'").fetchall()
        out: dict[str, tuple[int, float, int]] = {}
        for query, calls, ms, blocks in rows:
            c, m, b = out.get(query, (0, 0.0, 0))
            out[query] = (c + calls, m + ms, b + blocks)
        return out

    def tables(self) -> tuple[int, int]:
        """(dead tuples of every table, database bytes)."""
        return self.conn.execute(
            "SELECT COALESCE(sum(n_dead_tup), 0)::bigint, pg_database_size(current_database())"
            "  FROM pg_stat_user_tables").fetchone()


class Engine:
    """The engine's services, driven in this process."""

    def __init__(self, per_publish: int) -> None:
        from broker.models import Channel, Producer
        from consumers.models import Consumer
        from jobs.publish.auth import PublishContext

        channel = Channel.objects.get(channel_id=CHANNEL)
        producer = Producer.objects.get(producer_id=PRODUCER)
        self.ctx = PublishContext(channel_pk=channel.pk, channel_id=CHANNEL, producer_pk=producer.pk,
                                  producer_id=PRODUCER)
        self.pull_pk = Consumer.objects.get(channel=channel, consumer_id=PULL).pk
        self.per_publish = per_publish
        self.seq = 0
        self.problems: list[str] = []
        self.pushed = self.acked = self.published = 0

    def publish(self) -> None:
        from jobs.publish.messages import NewMessage, messages_publish

        messages = []
        for _ in range(self.per_publish):
            self.seq += 1
            messages.append(NewMessage(payload=b'{"i": %d, "pad": "%s"}' % (self.seq, b"x" * 200),
                                       content_type="application/json"))
        results = messages_publish(ctx=self.ctx, messages=messages)
        self.published += sum(1 for _, created in results if created)

    def push(self) -> None:
        from jobs.push.claim import jobs_claim_push
        from jobs.push.record import PushOutcome, jobs_push_record
        from jobs.state.transitions import DELIVERED

        jobs = jobs_claim_push(limit=200, worker="bench-storage")
        if jobs:
            jobs_push_record(outcomes=[
                PushOutcome(job_id=j.id, to_status=DELIVERED, attempt=j.retry_count + 1, age=0.001, duration_ms=1.0,
                            status_code=204, excerpt="", error="", request_id="", outcome="delivered")
                for j in jobs])
            self.pushed += len(jobs)

    def pull(self) -> None:
        from jobs.pull.ack import jobs_ack_inflight
        from jobs.pull.claim import jobs_claim
        from jobs.state.transitions import DELIVERED

        jobs = jobs_claim(consumer_pk=self.pull_pk, limit=500)
        if jobs:
            moved = jobs_ack_inflight(consumer_pk=self.pull_pk, job_ids=[j.id for j in jobs],
                                      to_statuses=[DELIVERED] * len(jobs), delays=[None] * len(jobs), max_retry=5,
                                      receipts=[j.receipt for j in jobs])
            self.acked += sum(1 for v in moved.values() if v[0])


def cycle(engine: Engine, n: int) -> None:
    """A tenth of a second at 300/s: see the module docstring."""
    from broker.counters import counters_compact
    from jobs.pull.next import pull_next_in
    from jobs.sweeps.inflight_timeout import jobs_expire_inflight
    from jobs.sweeps.message_expiry import jobs_expire_messages
    from jobs.sweeps.retention import retention_sweep

    for _ in range(2):
        engine.publish()
        engine.push()
        engine.publish()
    if n % 2 == 0:
        engine.pull()
        pull_next_in(consumer_pk=engine.pull_pk)  # what a waiting pull asks
    if n % 10 == 0:
        jobs_expire_inflight()
        jobs_expire_messages()
    if n % 50 == 0:
        counters_compact()
        retention_sweep()


def phase(name: str, server: Server, engine: Engine, cycles: int, first: int, top: int) -> dict:
    stmts0, cpu0, t0, msgs0 = server.statements(), server.cpu(), time.perf_counter(), engine.published
    for n in range(first, first + cycles):
        cycle(engine, n)
    wall = time.perf_counter() - t0
    stmts1, cpu1 = server.statements(), server.cpu()
    msgs = max(1, engine.published - msgs0)
    diff = []
    for query, (calls, ms, blocks) in stmts1.items():
        c0, m0, b0 = stmts0.get(query, (0, 0.0, 0))
        if calls > c0:
            diff.append((blocks - b0, ms - m0, calls - c0, query))
    db_ms = sum(d[1] for d in diff)
    blocks = sum(d[0] for d in diff)
    dead, size = server.tables()
    out = {"db": db_ms / msgs, "cpu": 1000 * (cpu1 - cpu0) / msgs, "buffers": blocks / msgs, "wall": wall,
           "msgs": msgs, "dead": dead, "size": size}
    print(f"phase {name:>9}: {msgs} messages in {wall:.1f} s; db {out['db']:.3f} ms/msg, CPU {out['cpu']:.3f} ms/msg, "
          f"{out['buffers']:.1f} buffers/msg; dead tuples {dead}, database {size / 1e6:.1f} MB", flush=True)
    for blocks_, ms, calls, query in sorted(diff, reverse=True)[:top]:
        print(f"    {blocks_ / msgs:8.2f} buf/msg {ms / msgs:7.4f} ms/msg {calls / msgs:6.3f} calls/msg  {query}", flush=True)
    return out


def statements_loaded(url: str) -> bool:
    """Whether the server of ``url`` preloads pg_stat_statements (this benchmark's only source)."""
    import psycopg

    with psycopg.connect(url) as conn:
        return "pg_stat_statements" in conn.execute("SHOW shared_preload_libraries").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=300, help="cycles of the baseline and released phases")
    parser.add_argument("--hold-cycles", type=int, default=1500, help="cycles while the snapshot is held")
    parser.add_argument("--per-publish", type=int, default=8, help="messages per grouped publish (4 a cycle)")
    parser.add_argument("--retention", default="60s", help="the channel's retention")
    parser.add_argument("--top", type=int, default=8, help="statements printed per phase")
    args = smoke_args_parse(parser, cycles=20, hold_cycles=40)

    from broker.embedded_db import server_ensure, server_stop

    base = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    os.environ["BROKER_EMBEDDED_PG_OPTIONS"] = (os.environ.get("BROKER_EMBEDDED_PG_OPTIONS", "")
                                                + " -c shared_preload_libraries=pg_stat_statements")
    problems: list[str] = []
    holder = None
    own = False
    try:
        url = os.environ.get("DATABASE_URL")
        if url and not statements_loaded(url):  # (the smoke test's server): one of our own that has them
            print("storage: DATABASE_URL's server does not preload pg_stat_statements: an embedded one instead")
            url = None
        own = url is None  # a server this run starts, and stops
        url = url or server_ensure(base).url
        django_setup(url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from broker.durations import duration_parse
        from broker.registry import Precondition, channel_upsert

        channel_upsert(channel_id=CHANNEL, name=None, token=f"{CHANNEL}-token", precondition=Precondition(None),
                       settings={"retention": duration_parse(args.retention)})
        registry_create(channels=[], producers=[PRODUCER], consumers=[(CHANNEL, PULL, "pull", "")])
        from broker.models import Channel
        from consumers.services import consumer_upsert

        consumer_upsert(channel=Channel.objects.get(channel_id=CHANNEL), consumer_id=PUSH, name=None, token="t",
                        callback_url="http://127.0.0.1:9/cb", type="push", settings={"max_in_flight": 500},
                        precondition=Precondition(None))
        server = Server(url)
        engine = Engine(args.per_publish)
        for n in range(20):  # warm: prepared statements, caches
            cycle(engine, n)
        base_ = phase("baseline", server, engine, args.cycles, 20, args.top)
        import psycopg

        holder = psycopg.connect(url)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM jobs_job").fetchone()
        holder.execute("SELECT count(*) FROM broker_message").fetchone()
        held = phase("held", server, engine, args.hold_cycles, 20 + args.cycles, args.top)
        holder.rollback()
        holder.close()
        holder = None
        after = phase("released", server, engine, args.cycles, 20 + args.cycles + args.hold_cycles, args.top)
        for label, p in (("held/baseline", held), ("released/baseline", after)):
            print(f"ratio {label}: db {p['db'] / max(base_['db'], 1e-9):.2f}, CPU {p['cpu'] / max(base_['cpu'], 1e-9):.2f}, "
                  f"buffers {p['buffers'] / max(base_['buffers'], 1e-9):.2f}", flush=True)
        for _ in range(20):  # drain what the last cycles published
            engine.push()
            engine.pull()
        if engine.pushed < engine.published or engine.acked < engine.published - 500:
            problems.append(f"published {engine.published}, pushed {engine.pushed}, acked {engine.acked}")
    finally:
        if holder is not None:
            holder.close()
        if own:  # (not DATABASE_URL: django_setup has set it to the embedded server's)
            server_stop(base)
    smoke_problems_exit(problems=problems)


if __name__ == "__main__":
    main()
