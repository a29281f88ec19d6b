"""Big tables for the plan tests, built once per module with INSERT ... SELECT generate_series.

One channel; per message a job for several consumers with a realistic mix of states:
- ``pull``: a 200k backlog (mostly QUEUED, some in flight with past and future deadlines, dead,
  delivered, a few delayed retries), the consumer every pull statement is asked about;
- ``push``: mostly delivered, queued first attempts and retries in backoff, in flight, dead;
- ``grouped`` (overflow priority group), ``parts`` (partitioned: 5,000 partitions, gates 0 and 1),
  ``bell`` (a doorbell: pull consumer with a callback URL).

Statistics are made as they are when a backlog appears: the tables are analyzed while small (the
steady state), autovacuum is off for the module, then the bulk lands. The ``stats`` fixture runs
the "fresh" cases first on those statistics, then ANALYZE, then the "analyzed" cases.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

SMALL = 2_000  # messages before the steady-state ANALYZE
BIG = 200_000  # messages of the backlog (the pull consumer's jobs; jobs_job gets ~440k rows)
PARTITIONS = 5_000
TABLES = ("jobs_job", "broker_message", "jobs_partition", "broker_counter", "broker_counterdelta",
          "consumers_pullwaiter", "jobs_jobtransition", "jobs_minutestat", "consumers_consumer",
          "consumers_doorbellstate", "consumers_advisory")


@dataclass
class World:
    channel: int
    producer: int
    pull: int
    push: int
    grouped: int
    parts: int
    bell: int
    queued_job: int  # QUEUED job of ``pull``
    inflight_jobs: list  # INFLIGHT jobs of ``pull``
    dead_job: int
    partition: int
    parts_inflight_job: int  # INFLIGHT job of ``parts`` (gate moves)

    @property
    def consumers(self) -> list[int]:
        return [self.pull, self.push, self.grouped, self.parts, self.bell]


_MESSAGES = """
INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                            status, received_at, dispatched_at)
SELECT %(ch)s, 'm' || g, %(pr)s, convert_to('{"n": ' || g || ', "pad": "' || repeat('x', 200) || '"}', 'UTF8'),
       'application/json', CASE WHEN g %% 50 = 0 THEN 5 ELSE 0 END, '{}', 102,
       now() - (%(hi)s - g) * interval '10 ms', now()
  FROM generate_series(%(lo)s::int, %(hi)s::int - 1) g
"""

# one INSERT per consumer: (share of messages, status, retry, next attempt, deadline, partition, gate)
_JOBS = """
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      deadline, incremental_timeout, status_changed_at, created_at, partition_id, gate)
SELECT m.id, %(consumer)s, %(ch)s, x.status, m.priority, x.retry,
       now() + x.delay * interval '1 second',
       CASE WHEN x.status = 1002 THEN now() + x.deadline * interval '1 second' END,
       0, now(), m.received_at, x.partition, x.gate
  FROM broker_message m
  CROSS JOIN LATERAL (SELECT substr(m.message_id, 2)::int AS g) n
  CROSS JOIN LATERAL ({SHAPE}) x
 WHERE m.channel_id = %(ch)s AND n.g >= %(lo)s AND n.g < %(hi)s AND x.status IS NOT NULL
 ORDER BY m.id
"""

SHAPES = {
    # status, retry, delay (s from now; negative: due), deadline (s from now), partition, gate
    "pull": """SELECT CASE WHEN n.g %% 100 < 90 THEN 1001 WHEN n.g %% 100 < 94 THEN 1002
                           WHEN n.g %% 100 < 97 THEN 1004 ELSE 1003 END AS status,
                      CASE WHEN n.g %% 20 = 1 THEN 1 ELSE 0 END AS retry,
                      CASE WHEN n.g %% 40 = 1 THEN 3600 ELSE -60 END AS delay,
                      CASE WHEN n.g %% 2 = 0 THEN -30 ELSE 60 END AS deadline,
                      NULL::bigint AS partition, 0 AS gate""",
    "push": """SELECT CASE WHEN n.g %% 4 = 0 THEN NULL WHEN n.g %% 100 < 70 THEN 1003
                           WHEN n.g %% 100 < 90 THEN 1001 WHEN n.g %% 100 < 94 THEN 1002 ELSE 1004 END AS status,
                      CASE WHEN n.g %% 10 = 3 THEN 2 ELSE 0 END AS retry,
                      CASE WHEN n.g %% 20 = 3 THEN 600 ELSE -60 END AS delay,
                      CASE WHEN n.g %% 2 = 0 THEN -30 ELSE 60 END AS deadline,
                      NULL::bigint AS partition, 0 AS gate""",
    "grouped": """SELECT CASE WHEN n.g %% 5 = 0 THEN 1001 END AS status, 0 AS retry, -60 AS delay, 0 AS deadline,
                         NULL::bigint AS partition, 0 AS gate""",
    "parts": """SELECT CASE WHEN n.g %% 4 <> 0 THEN NULL WHEN n.g %% 1000 = 0 THEN 1002 ELSE 1001 END AS status,
                       0 AS retry, -60 AS delay, 60 AS deadline,
                       %(p0)s::bigint + (n.g / 4) %% %(parts)s AS partition, (n.g / 4 / %(parts)s) %% 2 AS gate""",
    "bell": """SELECT CASE WHEN n.g %% 200 = 0 THEN 1001 END AS status, 0 AS retry, -60 AS delay, 0 AS deadline,
                      NULL::bigint AS partition, 0 AS gate""",
}


def _fill(cur, w: World, lo: int, hi: int, p0: int) -> None:
    cur.execute(_MESSAGES, {"ch": w.channel, "pr": w.producer, "lo": lo, "hi": hi})
    for name, shape in SHAPES.items():
        cur.execute(_JOBS.replace("{SHAPE}", shape), {"consumer": getattr(w, name), "ch": w.channel, "lo": lo,
                                                      "hi": hi, "p0": p0, "parts": PARTITIONS})


def _world(cur) -> tuple[World, int]:
    from django.utils import timezone

    from broker.models import Channel, Producer
    from consumers.models import Consumer

    now = timezone.now()
    ch = Channel.objects.create(channel_id="plans", name="plans", token="t", updated_at=now)
    pr = Producer.objects.create(producer_id="plans", name="plans", token="t", updated_at=now)

    def consumer(name, type_, **extra):
        return Consumer.objects.create(channel=ch, consumer_id=name, name=name, token="t", type=type_,
                                       updated_at=now, **extra).pk

    ids = {
        "pull": consumer("pull", "pull", max_ack_pending=100_000),
        "push": consumer("push", "push", callback_url="http://127.0.0.1:9/cb", max_in_flight=100_000),
        "grouped": consumer("grouped", "pull", priority_policy="overflow", priority_groups=["A"]),
        "parts": consumer("parts", "pull"),
        "bell": consumer("bell", "pull", callback_url="http://127.0.0.1:9/bell"),
    }
    cur.execute("INSERT INTO jobs_partition (consumer_id, key) SELECT %s, 'k' || g FROM generate_series(0, %s - 1) g",
                [ids["parts"], PARTITIONS])
    cur.execute("SELECT min(id) FROM jobs_partition WHERE consumer_id = %s", [ids["parts"]])
    p0 = cur.fetchone()[0]
    w = World(channel=ch.pk, producer=pr.pk, queued_job=0, inflight_jobs=[], dead_job=0, partition=p0,
              parts_inflight_job=0, **ids)
    return w, p0


def _extras(cur, w: World) -> None:
    """The small tables at a busy size: waiting pulls of many consumers (no constraint on the
    consumer), counters of many owners with unfolded deltas, a doorbell state."""
    cur.execute("""
        INSERT INTO consumers_pullwaiter ("group", priority, pin_id, batch, job_ids, state, turn, arrived_at,
                                          expires_at, consumer_id)
        SELECT '', 0, '', 1, '{}', 0, 0, now(), now() + (g % 3 - 1) * interval '30 seconds', 1000000 + g % 500
          FROM generate_series(1, 5000) g""")
    cur.execute("""
        INSERT INTO consumers_pullwaiter ("group", priority, pin_id, batch, job_ids, state, turn, arrived_at,
                                          expires_at, consumer_id)
        SELECT 'A', 0, '', 10, '{}', 0, 0, now(), now() + interval '30 seconds', c FROM unnest(%s::bigint[]) c""",
                [[w.pull, w.grouped]])
    cur.execute("""
        INSERT INTO broker_counter (scope, owner_id, status, count)
        SELECT 1, 1000000 + o, s, 10 FROM generate_series(1, 2000) o, unnest(ARRAY[1001, 1002, 1003, 1004]) s""")
    cur.execute("""
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 1, 1000000 + g % 2000, 1001 + g % 4, 1 FROM generate_series(1, 50000) g""")
    cur.execute("INSERT INTO consumers_doorbellstate (consumer_id, armed, rings, failures) VALUES (%s, false, 0, 0)",
                [w.bell])


@pytest.fixture(scope="module")
def big_world(django_db_setup, django_db_blocker):
    """The big tables (committed), with fresh statistics; removed afterwards."""
    from django.db import connection

    with django_db_blocker.unblock():
        with connection.cursor() as cur:
            cur.execute("SELECT NOT EXISTS (SELECT 1 FROM jobs_job) AND NOT EXISTS (SELECT 1 FROM broker_message)")
            empty_before = cur.fetchone()[0]
            w, p0 = _world(cur)
            _fill(cur, w, 0, SMALL, p0)
            for table in TABLES:
                cur.execute(f"ANALYZE {table}")
                cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            _fill(cur, w, SMALL, SMALL + BIG, p0)
            _extras(cur, w)
            cur.execute("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1001 ORDER BY id DESC LIMIT 1",
                        [w.pull])
            w.queued_job = cur.fetchone()[0]
            cur.execute("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1002 ORDER BY id DESC LIMIT 100",
                        [w.pull])
            w.inflight_jobs = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1004 ORDER BY id DESC LIMIT 1",
                        [w.pull])
            w.dead_job = cur.fetchone()[0]
            cur.execute("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1002 LIMIT 1", [w.parts])
            w.parts_inflight_job = cur.fetchone()[0]
        try:
            yield w
        finally:
            with connection.cursor() as cur:
                if empty_before:
                    cur.execute("TRUNCATE jobs_job, broker_message, jobs_jobtransition")
                else:
                    cur.execute("DELETE FROM jobs_job WHERE channel_id = %s", [w.channel])
                    cur.execute("DELETE FROM broker_message WHERE channel_id = %s", [w.channel])
                cur.execute("DELETE FROM jobs_partition WHERE consumer_id = %s", [w.parts])
                cur.execute("DELETE FROM consumers_pullwaiter WHERE consumer_id >= 1000000 OR consumer_id = ANY(%s)",
                            [w.consumers])
                cur.execute("DELETE FROM broker_counter WHERE owner_id >= 1000000 OR owner_id = ANY(%s)", [w.consumers])
                cur.execute("DELETE FROM broker_counterdelta WHERE owner_id >= 1000000 OR owner_id = ANY(%s)",
                            [w.consumers])
                cur.execute("DELETE FROM consumers_doorbellstate WHERE consumer_id = %s", [w.bell])
                cur.execute("DELETE FROM consumers_consumer WHERE channel_id = %s", [w.channel])
                cur.execute("DELETE FROM broker_channel WHERE id = %s", [w.channel])
                cur.execute("DELETE FROM broker_producer WHERE id = %s", [w.producer])
                for table in TABLES:
                    cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


@pytest.fixture(scope="module")
def pg(big_world, django_db_blocker):
    """A psycopg connection of its own (autocommit) to the test database, for EXPLAIN."""
    import psycopg
    from django.db import connection

    with django_db_blocker.unblock():
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = psycopg.connect(**params, autocommit=True)
        try:
            yield conn
        finally:
            conn.close()


@pytest.fixture(scope="module", params=["fresh", "analyzed"])
def stats(request, big_world, pg):
    """Statistics as a new backlog meets them ("fresh": analyzed while small), then after ANALYZE.
    Module scope and this order: every fresh case runs before the ANALYZE."""
    if request.param == "analyzed":
        for table in TABLES:
            pg.execute(f"ANALYZE {table}")
    return request.param
