"""Big tables for the plan tests, built with INSERT ... SELECT generate_series, in the shapes
production meets (issue "Flat cost on the statistics production really has").

One channel; five consumers every statement is asked about (``pull``, ``push``, ``grouped``: an
overflow priority group, ``parts``: 5,000 partitions with gates 0 and 1, ``bell``: a doorbell pull
consumer), each with a realistic mix of states (queued, in flight with past and future deadlines,
dead, delivered, retries in backoff). How the jobs are spread is the ``distribution``:

- ``one``: the pull consumer owns ~all of ``jobs_job`` (a consumer that was down for an hour), the
  others a few dozen jobs each;
- ``one-push``: the same with the push consumer owning them;
- ``few``: four consumers share the messages (a job each per message);
- ``many``: 400 small consumers hold nearly every job; the five are small too.

Each distribution is seen in three ``phases``, in this order:

- ``fresh``: statistics as a new backlog meets them (tables analyzed while small, autovacuum off,
  then the bulk lands);
- ``analyzed``: after ``VACUUM ANALYZE`` (what autovacuum leaves once it caught up);
- ``acked``: after a burst of acks (the oldest tenth of the biggest consumer's queued jobs moved to
  DELIVERED: dead tuples at the head of the claim index), then ``ANALYZE`` without a vacuum, as
  autovacuum's analyze may run before its vacuum.

``BROKER_PLAN_ROWS`` sets the jobs of the biggest share (default 1,000,000; the ``one`` world has
that many, the others half or a quarter: what a plan follows is the skew, not the size).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from jobs.ops.plans import Sample

ROWS = int(os.environ.get("BROKER_PLAN_ROWS", "1000000"))
SMALL = 2_000  # messages before the steady-state ANALYZE
PARTITIONS = 5_000
SMALL_CONSUMERS = 400  # the "many" distribution
TABLES = ("jobs_job", "broker_message", "jobs_partition", "broker_counter", "broker_counterdelta_0", "broker_counterdelta_1",
          "consumers_pullwaiter", "jobs_jobtransition", "jobs_minutestat", "consumers_consumer",
          "consumers_doorbellstate", "consumers_advisory")
ROLES = ("pull", "push", "grouped", "parts", "bell")


@dataclass(frozen=True)
class Distribution:
    """How many messages, and which consumers get a job for message ``g`` (SQL over ``g``)."""
    messages: int
    shares: dict  # role -> SQL condition on g (true: the role gets a job for that message)
    small: bool = False  # jobs for SMALL_CONSUMERS small consumers too (one per message, round robin)
    biggest: str = "pull"  # the role whose jobs the burst of acks hits ("small": the small ones)


def _one(owner: str, rows: int = ROWS) -> Distribution:
    """``owner`` holds ~all of jobs_job; the others a few jobs each: ANALYZE's sample (30,000 rows)
    rarely sees them, so the statistics say one consumer (n_distinct ~1: a generic plan's
    "consumer_id = $1" matches ~every row), as in a database where one consumer's backlog is all there is."""
    rare = {"pull": "g % 250000 = 2", "push": "g % 250000 = 2", "grouped": "g % 250000 = 3",
            "parts": "g % 250000 = 7", "bell": "g % 250000 = 11"}
    return Distribution(rows, {**rare, owner: "true"}, biggest=owner)


DISTRIBUTIONS = {
    "one": _one("pull"),
    "one-push": _one("push", ROWS // 2),  # (the skew, not the size, is what a plan follows)
    "few": Distribution(ROWS // 4, {"pull": "true", "push": "true", "grouped": "true", "parts": "true",
                                    "bell": "g % 200 = 0"}),
    "many": Distribution(ROWS // 2, {"pull": "g % 100 = 1", "push": "g % 100 = 2", "grouped": "g % 100 = 3",
                                "parts": "g % 100 = 7", "bell": "g % 1000 = 11"}, small=True, biggest="small"),
}
PHASES = ("fresh", "analyzed", "acked")


@dataclass
class World(Sample):
    """A plan-test world: the ids the cases are explained with (jobs.ops.plans.Sample), and its shape."""
    small: list = field(default_factory=list)  # the "many" distribution's small consumers
    distribution: str = ""


_MESSAGES = """
INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority, headers,
                            status, received_at, dispatched_at)
SELECT %(ch)s, 'm' || g, %(pr)s, convert_to('{"n": ' || g || ', "pad": "' || repeat('x', 200) || '"}', 'UTF8'),
       'application/json', CASE WHEN g %% 50 = 0 THEN 5 ELSE 0 END, '{}', 102,
       now() - (%(hi)s - g) * interval '10 ms', now()
  FROM generate_series(%(lo)s::int, %(hi)s::int - 1) g
"""

# one INSERT per consumer role: the role's state shape over the messages its share selects
_JOBS = """
INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                      deadline, incremental_timeout, status_changed_at, created_at, partition_id, gate)
SELECT m.id, {CONSUMER}, %(ch)s, x.status, m.priority, x.retry,
       now() + x.delay * interval '1 second',
       CASE WHEN x.status = 1002 THEN now() + x.deadline * interval '1 second' END,
       0, now(), m.received_at, x.partition, x.gate
  FROM broker_message m
  CROSS JOIN LATERAL (SELECT substr(m.message_id, 2)::int AS g) n
  CROSS JOIN LATERAL ({SHAPE}) x
 WHERE m.channel_id = %(ch)s AND n.g >= %(lo)s AND n.g < %(hi)s AND ({SHARE})
 ORDER BY m.id
"""

def _mixed(status: str, retry: str, delay: str) -> str:
    """A role with jobs in every status: ``status``/``retry``/``delay`` are CASE branches over n.g;
    half the in-flight deadlines passed."""
    return (f"SELECT CASE {status} END AS status, CASE {retry} ELSE 0 END AS retry, CASE {delay} ELSE -60 END"
            " AS delay, CASE WHEN n.g %% 2 = 0 THEN -30 ELSE 60 END AS deadline, NULL::bigint AS partition, 0 AS gate")


# the state of a role's job for message n.g: status, retry, delay (s from now; negative: due),
# deadline (s from now), partition, gate
SHAPES = {
    "pull": _mixed("WHEN n.g %% 100 < 90 THEN 1001 WHEN n.g %% 100 < 94 THEN 1002 WHEN n.g %% 100 < 97 THEN 1004"
                   " ELSE 1003", "WHEN n.g %% 20 = 1 THEN 1", "WHEN n.g %% 40 = 1 THEN 3600"),
    "push": _mixed("WHEN n.g %% 100 < 60 THEN 1003 WHEN n.g %% 100 < 90 THEN 1001 WHEN n.g %% 100 < 94 THEN 1002"
                   " ELSE 1004", "WHEN n.g %% 10 = 3 THEN 2", "WHEN n.g %% 20 = 3 THEN 600"),
    "grouped": """SELECT 1001 AS status, 0 AS retry, -60 AS delay, 0 AS deadline,
                         NULL::bigint AS partition, 0 AS gate""",
    "parts": """SELECT CASE WHEN n.g %% 250 = 7 THEN 1002 ELSE 1001 END AS status,
                       0 AS retry, -60 AS delay, 60 AS deadline,
                       %(p0)s::bigint + n.g %% %(parts)s AS partition, (n.g / %(parts)s) %% 2 AS gate""",
    "bell": """SELECT 1001 AS status, 0 AS retry, -60 AS delay, 0 AS deadline,
                      NULL::bigint AS partition, 0 AS gate""",
}
_SMALL_CONSUMER = "(%(small)s::bigint[])[1 + n.g %% cardinality(%(small)s::bigint[])]"


def _fill(cur, w: World, d: Distribution, lo: int, hi: int, p0: int) -> None:
    params = {"ch": w.channel, "pr": w.producer, "lo": lo, "hi": hi, "p0": p0, "parts": PARTITIONS,
              "small": w.small}
    cur.execute(_MESSAGES, params)
    for role in ROLES:
        cur.execute(_JOBS.replace("{SHAPE}", SHAPES[role]).replace("{CONSUMER}", str(getattr(w, role)))
                    .replace("{SHARE}", d.shares[role].replace("g", "n.g").replace("%", "%%")), params)
    if d.small:
        cur.execute(_JOBS.replace("{SHAPE}", SHAPES["pull"]).replace("{CONSUMER}", _SMALL_CONSUMER)
                    .replace("{SHARE}", "true"), params)


def _world(cur, name: str) -> tuple[World, int]:
    from django.utils import timezone

    from broker.models import Channel, Producer
    from consumers.models import Consumer

    now = timezone.now()
    ch = Channel.objects.create(channel_id="plans", name="plans", token="t", updated_at=now)
    pr = Producer.objects.create(producer_id="plans", name="plans", token="t", updated_at=now)

    def consumer(cid, type_, **extra):
        return Consumer.objects.create(channel=ch, consumer_id=cid, name=cid, token="t", type=type_,
                                       updated_at=now, **extra).pk

    ids = {
        "pull": consumer("pull", "pull", max_ack_pending=100_000),
        "push": consumer("push", "push", callback_url="http://127.0.0.1:9/cb", max_in_flight=100_000),
        "grouped": consumer("grouped", "pull", priority_policy="overflow", priority_groups=["A"]),
        "parts": consumer("parts", "pull"),
        "bell": consumer("bell", "pull", callback_url="http://127.0.0.1:9/bell"),
    }
    small = []
    if DISTRIBUTIONS[name].small:
        small = [c.pk for c in Consumer.objects.bulk_create(
            Consumer(channel=ch, consumer_id=f"small{i}", name=f"small{i}", token="t",
                     type="push" if i % 2 else "pull", callback_url="http://127.0.0.1:9/small" if i % 2 else "",
                     updated_at=now) for i in range(SMALL_CONSUMERS))]
    cur.execute("INSERT INTO jobs_partition (consumer_id, key) SELECT %s, 'k' || g FROM generate_series(0, %s - 1) g",
                [ids["parts"], PARTITIONS])
    cur.execute("SELECT min(id) FROM jobs_partition WHERE consumer_id = %s", [ids["parts"]])
    p0 = cur.fetchone()[0]
    w = World(channel=ch.pk, producer=pr.pk, partition=p0, small=small, distribution=name,
              channel_name="plans", consumer_name="pull", **ids)
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


def _samples(cur, w: World) -> None:
    """The job ids the cases name: of their consumer, or of any consumer where a distribution
    gives that one no job in that state (a plan does not depend on whose job it is)."""
    def ids(consumer: int, status: int, n: int = 1) -> list[int]:
        for query, params in (
                ("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = %s ORDER BY id DESC LIMIT %s",
                 [consumer, status, n]),
                ("SELECT id FROM jobs_job WHERE status = %s ORDER BY id DESC LIMIT %s", [status, n])):
            cur.execute(query, params)
            found = [r[0] for r in cur.fetchall()]
            if found:
                return found
        raise AssertionError(f"the world has no job in status {status}")

    w.queued_job = ids(w.pull, 1001)[0]
    w.inflight_jobs = ids(w.pull, 1002, 100)
    w.dead_job = ids(w.pull, 1004)[0]
    cur.execute("SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1002 LIMIT 1", [w.parts])
    w.parts_inflight_job = cur.fetchone()[0]


@contextmanager
def _without_triggers(cur):
    """The bulk fill without row triggers (its ~4 foreign-key checks per job, the counter deltas):
    the rows are consistent by construction and the plans read only the tables' contents and
    statistics; a third of the build's time. Needs a superuser (the embedded server's); any other
    role fills with the triggers."""
    cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    superuser = cur.fetchone()[0]
    if superuser:
        cur.execute("SET session_replication_role = replica")
    try:
        yield
    finally:
        if superuser:
            cur.execute("RESET session_replication_role")


def _build(cur, name: str) -> World:
    d = DISTRIBUTIONS[name]
    w, p0 = _world(cur, name)
    _fill(cur, w, d, 0, SMALL, p0)
    for table in TABLES:
        cur.execute(f"ANALYZE {table}")
        cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    with _without_triggers(cur):
        _fill(cur, w, d, SMALL, SMALL + d.messages, p0)
    _extras(cur, w)
    _samples(cur, w)
    return w


def _acks(cur, w: World) -> None:
    """A burst of acks: the oldest tenth of the biggest consumer's QUEUED jobs DELIVERED (the
    history trigger writes their transitions), then ANALYZE without a vacuum."""
    d = DISTRIBUTIONS[w.distribution]
    owners = w.small if d.biggest == "small" else [getattr(w, d.biggest)]
    cur.execute("""
        WITH q AS (SELECT id FROM jobs_job WHERE consumer_id = ANY(%(owners)s) AND status = 1001
                    ORDER BY id LIMIT %(n)s)
        UPDATE jobs_job j SET status = 1002, status_changed_at = now(), deadline = now() + interval '30 s',
                              last_reason = 'plans-claim'
          FROM q WHERE j.id = q.id""", {"owners": owners, "n": d.messages // 10})
    cur.execute("""
        UPDATE jobs_job SET status = 1003, status_changed_at = now(), deadline = NULL, last_reason = 'plans-ack'
         WHERE consumer_id = ANY(%(owners)s) AND status = 1002 AND last_reason = 'plans-claim'""", {"owners": owners})
    for table in TABLES:
        cur.execute(f"ANALYZE {table}")


def _clear(cur, w: World, empty_before: bool) -> None:
    if empty_before:
        cur.execute("TRUNCATE jobs_job, broker_message, jobs_jobtransition")
    else:
        cur.execute("DELETE FROM jobs_job WHERE channel_id = %s", [w.channel])
        cur.execute("DELETE FROM broker_message WHERE channel_id = %s", [w.channel])
    ids = w.consumers + w.small
    cur.execute("DELETE FROM jobs_partition WHERE consumer_id = %s", [w.parts])
    cur.execute("DELETE FROM consumers_pullwaiter WHERE consumer_id >= 1000000 OR consumer_id = ANY(%s)", [ids])
    cur.execute("DELETE FROM broker_counter WHERE owner_id >= 1000000 OR owner_id = ANY(%s)", [ids])
    cur.execute("DELETE FROM broker_counterdelta WHERE owner_id >= 1000000 OR owner_id = ANY(%s)", [ids])
    cur.execute("DELETE FROM consumers_doorbellstate WHERE consumer_id = %s", [w.bell])
    cur.execute("DELETE FROM consumers_consumer WHERE channel_id = %s", [w.channel])
    cur.execute("DELETE FROM broker_channel WHERE id = %s", [w.channel])
    cur.execute("DELETE FROM broker_producer WHERE id = %s", [w.producer])
    for table in TABLES:
        cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


class Worlds:
    """The one world alive at a time: built when a distribution is first asked for, removed when
    another one is (the phases of a distribution run in order on the same tables)."""

    def __init__(self, blocker):
        self.blocker = blocker
        self.current: World | None = None
        self.phase = ""
        self.empty_before = True

    def get(self, name: str, phase: str) -> World:
        from django.db import connection

        with self.blocker.unblock(), connection.cursor() as cur:
            if self.current is None or self.current.distribution != name:
                self.close()
                cur.execute("SELECT NOT EXISTS (SELECT 1 FROM jobs_job) AND NOT EXISTS (SELECT 1 FROM broker_message)")
                self.empty_before = cur.fetchone()[0]
                self.current, self.phase = _build(cur, name), "fresh"
            order = PHASES.index
            assert order(phase) >= order(self.phase), f"phase {phase} after {self.phase}: the phases run in order"
            if phase == "analyzed" and self.phase == "fresh":
                for table in TABLES:
                    cur.execute(f"VACUUM ANALYZE {table}")
            if phase == "acked" and self.phase != "acked":
                _acks(cur, self.current)
                _samples(cur, self.current)
            self.phase = phase
        return self.current

    def close(self) -> None:
        from django.db import connection

        if self.current is not None:
            with self.blocker.unblock(), connection.cursor() as cur:
                _clear(cur, self.current, self.empty_before)
            self.current = None


@pytest.fixture(scope="module")
def worlds(django_db_setup, django_db_blocker):
    w = Worlds(django_db_blocker)
    try:
        yield w
    finally:
        w.close()


STATS = [f"{name}-{phase}" for name in DISTRIBUTIONS for phase in PHASES]


@pytest.fixture(scope="module", params=STATS)
def stats(request, worlds):
    """``<distribution>-<phase>``: the world in that shape and phase (module scope, in this order:
    every case of a phase runs before the next phase, every phase of a distribution before the next)."""
    name, _, phase = request.param.rpartition("-")
    worlds.get(name, phase)
    return request.param


@pytest.fixture
def big_world(stats, worlds):
    return worlds.current


@pytest.fixture(scope="module")
def pg(worlds, django_db_blocker):
    """A psycopg connection of its own (autocommit) to the test database, for EXPLAIN, with the
    connection parameters (and so the session options: jit = off) of every broker connection."""
    import psycopg
    from django.db import connection

    with django_db_blocker.unblock():
        params = connection.get_connection_params()
        for django_only in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(django_only, None)
        conn = psycopg.connect(**params, autocommit=True)
        try:
            yield conn
        finally:
            conn.close()
