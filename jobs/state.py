"""The job state machine: the only module that writes ``jobs_job.status``.

States and allowed moves (see ../shared/design.md):

    QUEUED   -> INFLIGHT   claimed by a push worker or a pull client
    INFLIGHT -> DELIVERED  success
    INFLIGHT -> DEAD       the consumer gives up, or retries are exhausted
    INFLIGHT -> QUEUED     deadline passed or attempt failed (retry + 1; DEAD past the limit)
    DEAD     -> INFLIGHT   a pull consumer retries a dead job (retry + 1)
    DEAD     -> QUEUED     an operator / the DLQ requeues it, or a replay (retry reset to 0)
    DELIVERED -> QUEUED    a replay (``jobs_replay_chunk``, retry reset to 0)
    QUEUED   -> DEAD       an operator gives up on a job (``jobs_mark_dead``; also INFLIGHT -> DEAD)

Every move is one conditional UPDATE guarded by the expected status, so two actors can never
both win; every move appends a ``jobs_jobtransition`` row in the same statement. Hot paths (claim,
ack, sweep) are single batched SQL statements over ``unnest`` arrays rather than ORM loops:
measured on this machine, batched raw claims/acks run ~40k jobs/s versus ~0.4k/s per-job ORM.
Time always comes from the database (``now()``), never from a worker's clock.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from django.conf import settings
from django.db import connection

from consumers.models import CircuitState
from jobs.models import JobStatus

QUEUED = JobStatus.QUEUED.value
INFLIGHT = JobStatus.INFLIGHT.value
DELIVERED = JobStatus.DELIVERED.value
DEAD = JobStatus.DEAD.value
CB_CLOSED = CircuitState.CLOSED.value
CB_OPEN = CircuitState.OPEN.value
CB_HALF_OPEN = CircuitState.HALF_OPEN.value

ALLOWED = {
    (QUEUED, INFLIGHT),
    (INFLIGHT, DELIVERED),
    (INFLIGHT, DEAD),
    (INFLIGHT, QUEUED),
    (DEAD, INFLIGHT),
    (DEAD, QUEUED),
    (QUEUED, DEAD),  # an operator gives up, or the message expired (jobs.expiry)
    (DELIVERED, QUEUED),  # replay (jobs.replay): deliver a delivered message again
}


# --- how the hot statements are planned -------------------------------------------------------

# Statuses are written into the SQL as literals, never bound as parameters: only a literal lets a
# plan (a cached generic plan above all) use the partial indexes that hold one status (job_claim,
# job_inflight_deadline, ...). Bound, the pull claim's generic plan fetched every QUEUED job of the
# consumer through job_consumer_status and sorted them (833 ms per pull + ack at a 1M backlog).
_STATUS_PLACEHOLDERS = {"queued": QUEUED, "inflight": INFLIGHT, "delivered": DELIVERED, "dead": DEAD}
_STATUS_PARAM = re.compile(r"%\((queued|inflight|delivered|dead)\)s(?:::smallint)?")


def statuses_inline(sql: str) -> str:
    """``%(queued)s`` (and the other status placeholders) as the status's literal."""
    return _STATUS_PARAM.sub(lambda m: str(_STATUS_PLACEHOLDERS[m.group(1)]), sql)


# plan_cache_mode = force_generic_plan on every connection of the broker (``jobs.apps``), decided
# for the server-side prepared statements of the hot paths (``prepared_fetchall``, the push
# dispatcher), the only statements it applies to (Django binds its own queries client-side):
# - each is written so that one plan is right for every parameter value (statuses inlined, ids
#   looked up by primary key, LIMIT on an index walk in the index's order), and tests/plans checks
#   that its generic plan uses the index it was written for, with the statistics a new backlog
#   meets and after ANALYZE;
# - planning costs more than running them (a pull claim plans in ~0.7 ms and runs in ~1 ms), so a
#   plan made once per connection is what keeps a pull cheap;
# - custom plans follow the statistics of the moment: right after a backlog appears those describe
#   the small table of before, and the plan flipped (queued-jobs 8.8 ms at 10k, 73.5 ms at 100k,
#   5.0 ms at 1M); under ``auto`` PostgreSQL also re-plans (custom) whenever its estimate favours it.
PLAN_CACHE_MODE = "force_generic_plan"


def connection_plan_setup(sender=None, connection=None, **kwargs) -> None:
    """Django's ``connection_created``: plan the session's prepared statements generically (see
    PLAN_CACHE_MODE). Sent in autocommit right after connecting, so no rollback undoes it."""
    if connection is None or connection.vendor != "postgresql":
        return
    if not getattr(settings, "BROKER_PREPARED_STATEMENTS", True):
        return  # nothing is prepared: every statement is planned with its values
    with connection.cursor() as cur:
        cur.execute(f"SET plan_cache_mode = {PLAN_CACHE_MODE}")


class IllegalTransition(Exception):
    pass


# --- timing helpers ------------------------------------------------------------------------------

def stop_timeout(connection_timeout: float | None = None) -> float:
    """webhook-broker's stopTimeout: the connection timeout plus 250 ms."""
    timeout = settings.BROKER_CONNECTION_TIMEOUT if connection_timeout is None else connection_timeout
    return float(timeout) + 0.25


def inflight_timeout(incremental_timeout: float = 0.0, connection_timeout: float | None = None) -> float:
    """Seconds a claimed job may stay INFLIGHT: stopTimeout + rationalDelay + IncrementalTimeout."""
    return stop_timeout(connection_timeout) + float(settings.BROKER_RATIONAL_DELAY) + float(incremental_timeout or 0)


def backoff_delay(retry: int, steps: Sequence[float] | None = None, *, jitter: bool = True) -> float:
    """Delay before attempt ``retry`` + 1 (retry >= 1), as webhook-broker computes it.

    Within the list the n-th step is used; beyond it steps grow linearly by the last value
    (5,30,60 -> 5, 30, 60, 120, 180, ...). Up to 10% jitter spreads the retries of one outage.
    """
    steps = list(steps or settings.BROKER_RETRY_BACKOFF) or [5.0]
    n = max(int(retry), 1)
    k = len(steps)
    delay = steps[n - 1] if n < k else (n - k + 1) * steps[-1]
    if jitter and delay > 0:
        delay += random.uniform(0, delay * 0.1)
    return float(delay)


def max_retry_for(consumer_max_retry: int | None) -> int:
    return settings.BROKER_MAX_RETRY if consumer_max_retry is None else int(consumer_max_retry)


# --- creation ------------------------------------------------------------------------------------

# Filters (broker.message_types): a consumer gets the job when it has no patterns, a ``*``, an equal
# type, or a ``p.*`` whose prefix is the type or starts it (``p.``). starts_with and equality, never
# LIKE: types may contain ``_``. Unfiltered consumers pay one IS NULL test per row.
_TYPE_FILTER = """(c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))"""


def jobs_fanout_sql(source: str, *, partitioned: bool = False) -> str:
    """SQL for two CTEs that create one QUEUED job per (message in CTE ``source``, consumer of
    its channel whose type patterns match the message's type) and NOTIFY the consumers' waiters.
    ``source`` must expose ``id``, ``priority``, ``channel_id``, ``type`` and ``expires_at`` (copied
    onto each job, so claims filter expired jobs without a join). Publishing composes this into its
    insert statement so a publish is one round trip and one implicit transaction: the message and
    its jobs exist together or not at all, and the NOTIFY is delivered on commit, when the rows are
    visible.

    ``partitioned``: ``source`` also exposes ``pkey`` (text or NULL) and ``gate``, and each job
    joins its consumer's partition of the key (created by ``jobs.partitions.partitions_for_publish``
    in the same transaction). Only publishes that carry a partition key use it, so the others run
    exactly the statement they ran before partitions existed."""
    columns = values = join = ""
    if partitioned:
        columns = ", partition_id, gate"
        values = ", pt.id, CASE WHEN pt.id IS NULL THEN 0 ELSE src.gate END"
        join = "\n          LEFT JOIN jobs_partition pt ON pt.consumer_id = c.id AND pt.key = src.pkey"
    return f"""
    jobs_created AS (
        INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                              next_attempt_at, incremental_timeout, status_changed_at, created_at, expires_at{columns})
        SELECT src.id, c.id, c.channel_id, {QUEUED}, src.priority, 0, now(), 0, now(), now(), src.expires_at{values}
          FROM {source} src JOIN consumers_consumer c ON c.channel_id = src.channel_id{join}
         WHERE {_TYPE_FILTER}
         ORDER BY src.id, c.id  -- job ids follow message order: pulls are "oldest first" by job id
        RETURNING consumer_id
    ), jobs_notified AS (
        SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ',')) AS n
          FROM jobs_created HAVING count(*) > 0
    )"""


# --- the generic batched transition ------------------------------------------------------------

@dataclass
class Move:
    """One requested transition.

    ``delay``: seconds until the next attempt (QUEUED moves; None keeps the current time).
    ``timeout``: seconds until the in-flight deadline (INFLIGHT moves).
    ``max_retry``: for moves to QUEUED with ``retry_inc``: past this retry count the job goes
    DEAD instead (None: no limit).
    ``retry_reset``: set the retry count to 0 (operator requeue of a dead job).
    """

    job_id: int
    from_status: int
    to_status: int
    retry_inc: int = 0
    delay: float | None = None
    timeout: float | None = None
    incremental_timeout: float | None = None
    max_retry: int | None = None
    retry_reset: bool = False


_MOVE_SQL = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(from_s)s::smallint[], %(to_s)s::smallint[],
                         %(retry_inc)s::int[], %(delay)s::float8[], %(timeout)s::float8[],
                         %(inc)s::float8[], %(max_retry)s::int[], %(reset)s::bool[])
           AS v(id, from_s, to_s, retry_inc, delay, timeout, inc, max_retry, reset)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = %(queued)s AND v.max_retry IS NOT NULL
                           AND j.retry_count + v.retry_inc > v.max_retry
                      THEN %(dead)s ELSE v.to_s END,
        retry_count = CASE WHEN v.reset THEN 0 ELSE j.retry_count + v.retry_inc END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.delay IS NULL THEN j.next_attempt_at
                               ELSE now() + v.delay * interval '1 second' END,
        deadline = CASE WHEN v.to_s = %(inflight)s THEN now() + v.timeout * interval '1 second' END,
        incremental_timeout = COALESCE(v.inc, j.incremental_timeout)
      FROM v
     WHERE j.id = v.id AND j.status = v.from_s
       AND (%(consumer)s::bigint IS NULL OR j.consumer_id = %(consumer)s::bigint)
    RETURNING j.id, v.from_s, j.status, j.retry_count, j.deadline, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, from_s, status, retry_count, %(reason)s, now() FROM u
)
SELECT id, status, retry_count, deadline, partition_id FROM u
"""


def jobs_move(*, moves: Sequence[Move], reason: str, consumer_pk: int | None = None) -> dict[int, tuple]:
    """Apply many transitions in one statement; returns {job_id: (status, retry_count, deadline)}
    for the jobs that moved. A job absent from the result was not in its expected state (or
    belongs to another consumer): the caller decides what to answer.
    """
    for m in moves:
        if (m.from_status, m.to_status) not in ALLOWED:
            raise IllegalTransition(f"{m.from_status} -> {m.to_status}")
    if not moves:
        return {}
    params = {
        "ids": [m.job_id for m in moves],
        "from_s": [m.from_status for m in moves],
        "to_s": [m.to_status for m in moves],
        "retry_inc": [m.retry_inc for m in moves],
        "delay": [m.delay for m in moves],
        "timeout": [m.timeout for m in moves],
        "inc": [m.incremental_timeout for m in moves],
        "max_retry": [m.max_retry for m in moves],
        "reset": [m.retry_reset for m in moves],
        "consumer": consumer_pk,
        "reason": reason[:32],
        "queued": QUEUED,
        "dead": DEAD,
        "inflight": INFLIGHT,
    }
    with connection.cursor() as cur:
        cur.execute(_MOVE_SQL, params)
        rows = cur.fetchall()
    _settle_on_commit(row[4] for row in rows if row[1] != INFLIGHT)
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def job_move(*, job_id: int, from_status: int, to_status: int, reason: str,
             consumer_pk: int | None = None, **fields) -> tuple | None:
    """One transition; returns (status, retry_count, deadline) or None if the job was not in
    ``from_status``."""
    result = jobs_move(moves=[Move(job_id=job_id, from_status=from_status, to_status=to_status, **fields)],
                       reason=reason, consumer_pk=consumer_pk)
    return result.get(job_id)


# --- partitions: claim gating and settle hooks ---------------------------------------------------

# Partitions (jobs.partitions): a partitioned job is claimable only at its partition's current
# gate while the partition is AVAILABLE (push: also leased by the claiming worker); on an
# ``ordered`` consumer only the lowest-id unfinished job of the partition, and none while
# another is in flight. Non-partitioned jobs pay one ``partition_id IS NULL`` test (the claims
# keep using the ``job_claim`` partial index; the subqueries run for partitioned rows only, and the
# partition test is a correlated scalar subquery by primary key: as an EXISTS PostgreSQL may turn it
# into a hashed subplan that reads every AVAILABLE partition per claim).
PARTITION_AVAILABLE = 1


def partition_gate_sql(alias: str, *, ordered: str, lease: str = "") -> str:
    """The claim filter for rows of ``alias``: ``ordered`` is an SQL boolean expression, ``lease``
    extra conditions on the partition ``pt`` (the push worker's lease)."""
    return f"""({alias}.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = {alias}.partition_id
            AND pt.status = {PARTITION_AVAILABLE} {lease}) = {alias}.gate
        AND NOT ({ordered} AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = {alias}.partition_id AND o.gate = {alias}.gate
               AND o.id <> {alias}.id AND (o.status = {INFLIGHT} OR (o.status = {QUEUED} AND o.id < {alias}.id))))))"""


def _settle_on_commit(partition_ids) -> None:
    """Settle the partitions of jobs that just finished (DELIVERED / DEAD / moved), after the
    transaction commits: a settle must see every committed move, and the last committer of a
    partition's moves then always sees all of them (jobs.partitions.partitions_settle)."""
    ids = sorted({int(i) for i in partition_ids if i is not None})
    if not ids:
        return
    from django.db import transaction

    def settle() -> None:
        from jobs.partitions import partitions_settle

        partitions_settle(partition_ids=ids)

    transaction.on_commit(settle, robust=True)


# --- claims ----------------------------------------------------------------------------------------

# Flow control in every pull claim: nothing while the consumer is paused, and never more than
# maxAckPending jobs in flight, counted from the maintained counters (folded count + pending deltas;
# no COUNT(*) over jobs). Concurrent claims of one consumer may each see the same room, so the cap
# can be passed by at most the other pulls' batches in progress.
_PULL_ROOM = """SELECT CASE WHEN k.paused THEN 0 ELSE GREATEST(0, LEAST(%(limit)s::bigint,
            k.max_ack_pending - COALESCE((SELECT sum(x.n) FROM (
                SELECT count AS n FROM broker_counter
                 WHERE scope = 1 AND owner_id = k.id AND status = %(inflight)s
                UNION ALL
                SELECT delta FROM broker_counterdelta
                 WHERE scope = 1 AND owner_id = k.id AND status = %(inflight)s) x), 0)))::bigint END
          FROM consumers_consumer k WHERE k.id = %(consumer)s"""

# The common end of every pull claim: move the rows of CTE ``picked`` (ids, already locked with
# SKIP LOCKED) QUEUED -> INFLIGHT with their deadline, append the history, and return each job with
# its message. The claims differ only in how they pick.
# ``= ANY(ARRAY(...))``, not a join with ``picked``: the picked CTE's LIMIT is a subquery (the
# consumer's room), which the planner estimates at 10% of the table; joined, the generic plan then
# hashed a sequential scan of every job and every message for a 100-job claim (measured: 320 ms per
# claim with a 200k backlog, against under 2 ms with the array, which plans as primary-key lookups).
_CLAIM_TAIL = """
u AS (
    UPDATE jobs_job j SET
        status = %(inflight)s,
        status_changed_at = now(),
        deadline = now() + (%(timeout)s + COALESCE(%(inc)s, j.incremental_timeout)) * interval '1 second',
        incremental_timeout = COALESCE(%(inc)s, j.incremental_timeout)
     WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = %(queued)s
    RETURNING j.id, j.message_id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
              j.partition_id, j.gate, j.payload
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, %(queued)s, %(inflight)s, retry_count, %(reason)s, now() FROM u
)
SELECT u.id, u.priority, u.retry_count, u.incremental_timeout, u.deadline,
       m.message_id, COALESCE(u.payload, m.payload), m.content_type, m.headers,
       CASE WHEN u.partition_id IS NOT NULL
            THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type
  FROM u JOIN broker_message m ON m.id = u.message_id
 ORDER BY u.priority DESC, u.id
"""

_PULL_ORDERED = "(SELECT k.ordered FROM consumers_consumer k WHERE k.id = j.consumer_id)"

_CLAIM_SQL = """
WITH picked AS (
    SELECT j.id FROM jobs_job j
     WHERE j.consumer_id = %(consumer)s AND j.status = %(queued)s AND j.next_attempt_at <= now()
       AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry: never hand out an expired message
       AND {GATE}
     ORDER BY j.priority DESC, j.id
     LIMIT ({ROOM})
       FOR UPDATE SKIP LOCKED
), """.replace("{ROOM}", _PULL_ROOM).replace("{GATE}", partition_gate_sql("j", ordered=_PULL_ORDERED)) + _CLAIM_TAIL


def _headers(value) -> dict:
    """jsonb comes back as text through Django's connection (its JSONField decodes itself)."""
    if not value or value == "{}":
        return {}
    return json.loads(value) if isinstance(value, (str, bytes)) else value


@dataclass
class ClaimedJob:
    id: int
    priority: int
    retry_count: int
    incremental_timeout: float
    deadline: object
    message_id: str
    payload: bytes
    content_type: str
    headers: dict
    partition_key: str | None = None
    gate: int = 0
    message_type: str | None = None  # filters: the message's X-Broker-Message-Type


def claimed_jobs(rows) -> list[ClaimedJob]:
    """Rows shaped like ``_CLAIM_TAIL``'s result (id, priority, retry_count, incremental_timeout,
    deadline, message_id, payload, content_type, headers[, partition key, gate[, type]]) as ClaimedJob objects."""
    return [
        ClaimedJob(id=r[0], priority=r[1], retry_count=r[2], incremental_timeout=r[3], deadline=r[4],
                   message_id=r[5], payload=bytes(r[6]), content_type=r[7], headers=_headers(r[8]),
                   partition_key=r[9] if len(r) > 9 else None, gate=r[10] if len(r) > 10 and r[10] else 0,
                   message_type=r[11] if len(r) > 11 else None)
        for r in rows
    ]


def jobs_claim(*, consumer_pk: int, limit: int, incremental_timeout: float | None = None,
               connection_timeout: float | None = None, reason: str = "claim") -> list[ClaimedJob]:
    """Claim up to ``limit`` due QUEUED jobs of one consumer (priority, then oldest first), within
    the consumer's room (not paused, ``maxAckPending``).

    One prepared statement (pulls claim in many small statements, where planning would cost more
    than the claim): ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the rows, the UPDATE moves them
    to INFLIGHT with a deadline of stopTimeout + rationalDelay + IncrementalTimeout (an omitted
    IncrementalTimeout keeps the job's stored one), and the history rows are appended.
    """
    if limit <= 0:
        return []
    rows = prepared_fetchall(_CLAIM_SQL_TYPED, {
        "consumer": consumer_pk, "limit": int(limit), "queued": QUEUED, "inflight": INFLIGHT,
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
    })
    return claimed_jobs(rows)


# --- sweeps and operator actions ------------------------------------------------------------------

# The timeout sweep, all consumers (job_inflight_deadline) or one (job_inflight_consumer: a pull's
# lazy sweep of its own consumer must not step over the expired jobs of every other consumer).
_EXPIRE_SQL = """
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = {INFLIGHT} AND j.deadline < now() {CONSUMER}
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), u AS (
    -- by primary key only (``+ 0``; a join with c hashed every in-flight job per batch: 100,000
    -- expired jobs took 99 s at a 1M backlog); the consumer's retry limit per row
    UPDATE jobs_job j SET
        status = CASE WHEN j.retry_count + 1 > COALESCE(
                          (SELECT k.max_retry FROM consumers_consumer k WHERE k.id = j.consumer_id), %(max_retry)s)
                      THEN {DEAD} ELSE {QUEUED} END,
        retry_count = j.retry_count + 1,
        status_changed_at = now(),
        next_attempt_at = now(),
        deadline = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status + 0 = {INFLIGHT}
    RETURNING j.id, j.status, j.retry_count, j.consumer_id, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {INFLIGHT}, status, retry_count, 'timeout', now() FROM u
), n AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ','))
      FROM u WHERE status = {QUEUED} HAVING count(*) > 0
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n),
       (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL AND status = {DEAD})
"""
# (no ORDER BY over all consumers: each call requeues every expired job, and either in-flight index
# finds them without a sort; one consumer's come oldest first off its index)
_EXPIRE_ALL_SQL = _EXPIRE_SQL.replace("{CONSUMER}", "").format(QUEUED=QUEUED, INFLIGHT=INFLIGHT, DEAD=DEAD)
_EXPIRE_CONSUMER_SQL = _EXPIRE_SQL.replace("{CONSUMER}", "AND j.consumer_id = %(consumer)s ORDER BY j.deadline").format(
    QUEUED=QUEUED, INFLIGHT=INFLIGHT, DEAD=DEAD)
EXPIRE_BATCH = 5000
EXPIRE_BUDGET = 2.0  # seconds one sweep call may spend on batches (the dispatcher sweeps every second)


def jobs_expire_inflight(*, limit: int = EXPIRE_BATCH, consumer_pk: int | None = None,
                         budget: float = EXPIRE_BUDGET) -> int:
    """Move INFLIGHT jobs whose deadline passed back to QUEUED (retry + 1), or DEAD past the
    retry limit. Served by the partial indexes on in-flight deadlines: cheap when nothing is
    stale. ``consumer_pk`` limits it to one consumer (pull endpoints sweep their own consumer
    lazily, so pull timeouts hold even between the workers' sweeps).

    Batches of ``limit`` jobs, each its own statement (and, outside a transaction, its own commit:
    rows are locked SKIP LOCKED and only for one batch, so pulls and acks never wait), until a
    batch comes back short or ``budget`` seconds are spent: 100,000 expired jobs are requeued by
    one call instead of one batch a second. Returns how many jobs moved."""
    import time

    sql = _EXPIRE_ALL_SQL if consumer_pk is None else _EXPIRE_CONSUMER_SQL
    params = {"max_retry": settings.BROKER_MAX_RETRY, "limit": int(limit), "consumer": consumer_pk}
    total = 0
    stop_at = time.monotonic() + budget
    while True:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        _settle_on_commit(row[2] or [])
        moved = int(row[0])
        total += moved
        if moved < limit or time.monotonic() >= stop_at:
            return total


# One consumer's jobs of one status in id order, written so that only job_consumer_status
# (consumer, status, id DESC) serves it: ranges keep the sort keys that equalities would drop, so
# the planner cannot walk the primary key (or job_dead) filtering every other consumer's rows.
_ONE_CONSUMER_STATUS = ("consumer_id BETWEEN %(consumer)s AND %(consumer)s "
                        "AND status BETWEEN {status} AND {status}")
_ONE_CONSUMER_ORDER = "ORDER BY consumer_id DESC, status DESC, id"  # the index backwards: oldest first

_REQUEUE_DEAD_SQL = """
WITH c AS (
    SELECT id FROM jobs_job
     WHERE {WHERE}
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (expires_at IS NULL OR expires_at > now())  -- expiry: an expired message stays dead
     {ORDER} LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = %(queued)s, retry_count = 0, status_changed_at = now(),
                          next_attempt_at = now(), deadline = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status = %(dead)s  -- by primary key
    RETURNING j.id, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, %(dead)s, %(queued)s, 0, %(reason)s, now() FROM u
)
SELECT count(*), (SELECT pg_notify('broker_jobs', %(consumer)s::text) FROM u LIMIT 1),
       (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL) FROM u
""".replace("{WHERE}", _ONE_CONSUMER_STATUS.format(status=DEAD)).replace("{ORDER}", _ONE_CONSUMER_ORDER)

_DELETE_DEAD_SQL = """
DELETE FROM jobs_job WHERE id IN (
    SELECT id FROM jobs_job
     WHERE {WHERE}
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
   AND status = {DEAD}
RETURNING partition_id
""".replace("{WHERE}", _ONE_CONSUMER_STATUS.format(status=DEAD)).replace("{DEAD}", str(DEAD))


def jobs_requeue_dead(*, consumer_pk: int, job_ids: Iterable[int] | None = None,
                      reason: str = "requeue", batch: int = 5000) -> int:
    """DEAD -> QUEUED with the retry count reset (DLQ requeue, admin action). Works in batches so
    millions of dead jobs never hold one long lock. Returns the number requeued."""
    ids = list(job_ids) if job_ids is not None else None
    total = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(_REQUEUE_DEAD_SQL, {"consumer": consumer_pk, "dead": DEAD, "queued": QUEUED,
                                            "ids": ids, "limit": batch, "reason": reason[:32]})
            row = cur.fetchone()
            moved = int(row[0])
        _settle_on_commit(row[2] or [])  # a FAILED partition resumes (jobs.partitions)
        total += moved
        if moved < batch:
            return total


def jobs_delete_dead(*, consumer_pk: int, job_ids: Iterable[int] | None = None, batch: int = 5000) -> int:
    """Delete DEAD jobs of a consumer (DLQ purge / delete one). Returns how many were deleted."""
    ids = list(job_ids) if job_ids is not None else None
    total = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(_DELETE_DEAD_SQL, {"consumer": consumer_pk, "ids": ids, "limit": batch})
            deleted = cur.rowcount
            _settle_on_commit(r[0] for r in cur.fetchall())
        total += deleted
        if deleted < batch:
            return total


PURGED = 0  # to_status of the history row of a purged (deleted) QUEUED job: it has no status any more

_PURGE_QUEUED_SQL = """
WITH c AS (
    SELECT id FROM jobs_job
     WHERE {WHERE}
       AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s::timestamptz)
       AND (%(age)s::float8 IS NULL OR created_at < now() - %(age)s::float8 * interval '1 second')
     {ORDER} LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), d AS (
    DELETE FROM jobs_job j WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status = %(queued)s  -- by primary key
    RETURNING j.id, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, %(queued)s, %(purged)s, retry_count, 'purged', now() FROM d
)
SELECT count(*), (SELECT array_agg(DISTINCT partition_id) FROM d WHERE partition_id IS NOT NULL) FROM d
""".replace("{WHERE}", _ONE_CONSUMER_STATUS.format(status=QUEUED)).replace("{ORDER}", _ONE_CONSUMER_ORDER)


def jobs_purge_queued(*, consumer_pk: int, older_than=None, older_than_seconds: float | None = None,
                      batch: int = 5000, progress=None) -> int:
    """Delete a consumer's QUEUED jobs (a runaway backlog), optionally only those created before
    ``older_than`` (an aware datetime) or more than ``older_than_seconds`` ago (database time). Batches of ``batch`` rows, each its own statement and
    transaction (SKIP LOCKED, so a claim in progress is never waited for), so millions of jobs never
    hold one long lock. Every purged job gets a history row (QUEUED -> 0, reason ``purged``) in the
    same statement. ``progress(batch_count, total)`` is called after each batch. Returns the total."""
    total = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(_PURGE_QUEUED_SQL, {"consumer": consumer_pk, "queued": QUEUED, "purged": PURGED,
                                            "before": older_than, "age": older_than_seconds,
                                            "limit": int(batch)})
            row = cur.fetchone()
            deleted = int(row[0])
        _settle_on_commit(row[1] or [])
        total += deleted
        if progress is not None:
            progress(deleted, total)
        if deleted < batch:
            return total


_MARK_DEAD_SQL = """
WITH c AS (
    SELECT id, status FROM jobs_job
     WHERE id = ANY(%(ids)s::bigint[]) AND status IN (%(queued)s, %(inflight)s)
       AND (%(consumer)s::bigint IS NULL OR consumer_id = %(consumer)s::bigint)
     ORDER BY id
       FOR UPDATE
), u AS (
    UPDATE jobs_job j SET status = %(dead)s, status_changed_at = now(), deadline = NULL
      FROM c WHERE j.id = c.id AND j.status = c.status
    RETURNING j.id, c.status AS from_s, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, from_s, %(dead)s, retry_count, %(reason)s, now() FROM u
)
SELECT id, from_s, partition_id FROM u
"""


def jobs_mark_dead(*, job_ids: Iterable[int], reason: str = "operator",
                   consumer_pk: int | None = None) -> dict[int, int]:
    """An operator gives up on jobs: QUEUED or INFLIGHT -> DEAD (retry count kept, so a requeue
    starts them over). The one move an operator has that no consumer has: QUEUED -> DEAD. One
    statement; rows are locked in id order (waiting briefly for a claim in progress rather than
    skipping it) and each moves only from the status it had when locked. Returns {job_id:
    from_status} for the jobs that moved; other ids were already DELIVERED/DEAD or unknown. A push
    attempt in progress still records its attempt, but its outcome no longer moves the job."""
    ids = sorted({int(i) for i in job_ids})
    if not ids:
        return {}
    with connection.cursor() as cur:
        cur.execute(_MARK_DEAD_SQL, {"ids": ids, "queued": QUEUED, "inflight": INFLIGHT, "dead": DEAD,
                                     "consumer": consumer_pk, "reason": reason[:32]})
        rows = cur.fetchall()
    _settle_on_commit(row[2] for row in rows)
    return {row[0]: row[1] for row in rows}


# --- pull consumers: claim within a byte budget, extend a deadline -------------------------------

_PLACEHOLDER = re.compile(r"%\((\w+)\)s(?!::)")


def typed_sql(sql: str, types: dict[str, str]) -> str:
    """Add a cast to every placeholder not cast yet (``%(job)s`` -> ``%(job)s::bigint``): with
    server-side binding the server must know each parameter's type."""
    return _PLACEHOLDER.sub(lambda m: f"{m.group(0)}::{types[m.group(1)]}", sql)


def prepared_fetchall(sql: str, params: dict) -> list[tuple]:
    """Run ``sql`` on Django's connection as a server-side prepared statement (prepared once per
    connection, then reused). Django binds parameters client-side, so PostgreSQL plans every
    statement again; for the pull endpoints' multi-CTE statements planning costs more than
    running them (measured per spec-path transition: 0.91 -> 0.34 ms of database CPU, auth
    lookup 0.27 -> 0.06 ms). The SQL must cast its placeholders (``typed_sql``).

    Django turns psycopg's prepared statements off (``prepare_threshold=None``) for the sake of
    transaction-mode connection poolers; this enables them on the connection for explicit
    requests only (Django's own queries use client-side binding and are never prepared). Set
    ``BROKER_PREPARED_STATEMENTS = False`` behind a pooler that cannot keep them (PgBouncer < 1.21)."""
    import psycopg

    connection.close_if_health_check_failed()  # what connection.cursor() does, without a cursor
    connection.ensure_connection()
    raw = connection.connection
    prepare = getattr(settings, "BROKER_PREPARED_STATEMENTS", True)
    if prepare and raw.prepare_threshold is None:
        raw.prepare_threshold = 1 << 30  # never automatic: only statements executed with prepare=True
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cur:
        cur.execute(sql, params, prepare=True if prepare else None)
        result = cur.pgresult  # (not cur.description: it builds a Column per column, ~5% of a request)
        return cur.fetchall() if result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK else []


_CLAIM_BYTES_SQL = """
WITH c AS (
    SELECT j.id, j.priority, j.message_id, j.payload FROM jobs_job j
     WHERE j.consumer_id = %(consumer)s AND j.status = %(queued)s AND j.next_attempt_at <= now()
       AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry: never hand out an expired message
       AND {GATE}
     ORDER BY j.priority DESC, j.id
     LIMIT ({ROOM})
       FOR UPDATE SKIP LOCKED
), s AS (
    -- payload sizes by primary key (a join let a plan hash the whole message table)
    SELECT c.id,
           row_number() OVER w AS n,
           sum(COALESCE(octet_length(c.payload),
                        (SELECT octet_length(m.payload) FROM broker_message m WHERE m.id = c.message_id))) OVER w
               AS running
      FROM c
    WINDOW w AS (ORDER BY c.priority DESC, c.id)
), picked AS (
    SELECT id FROM s WHERE n = 1 OR running <= %(max_bytes)s
), """.replace("{ROOM}", _PULL_ROOM).replace("{GATE}", partition_gate_sql("j", ordered=_PULL_ORDERED)) + _CLAIM_TAIL
_CLAIM_SQL_TYPED = typed_sql(statuses_inline(_CLAIM_SQL), {
    "consumer": "bigint", "queued": "smallint", "limit": "int", "inflight": "smallint", "timeout": "float8",
    "inc": "float8", "reason": "text"})


_CLAIM_BYTES_SQL = typed_sql(statuses_inline(_CLAIM_BYTES_SQL), {
    "consumer": "bigint", "queued": "smallint", "limit": "int", "max_bytes": "bigint", "inflight": "smallint",
    "timeout": "float8", "inc": "float8", "reason": "text"})


def jobs_claim_within_bytes(*, consumer_pk: int, limit: int, max_bytes: int,
                            incremental_timeout: float | None = None, connection_timeout: float | None = None,
                            reason: str = "claim") -> list[ClaimedJob]:
    """Like ``jobs_claim``, but stop before the payloads add up to more than ``max_bytes``
    (always at least one job, so one large payload cannot block the consumer). One statement:
    the candidates are locked with SKIP LOCKED, the running payload sum (from the stored size,
    no detoasting) cuts the prefix that fits, and only that prefix moves to INFLIGHT."""
    if limit <= 0:
        return []
    params = {
        "consumer": consumer_pk, "limit": int(limit), "max_bytes": int(max_bytes),
        "queued": QUEUED, "inflight": INFLIGHT,
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
    }
    rows = prepared_fetchall(_CLAIM_BYTES_SQL, params)
    return claimed_jobs(rows)


_EXTEND_SQL = """
UPDATE jobs_job SET
    deadline = GREATEST(deadline,
                        now() + (%(timeout)s + COALESCE(%(inc)s, incremental_timeout)) * interval '1 second'),
    incremental_timeout = COALESCE(%(inc)s, incremental_timeout)
 WHERE id = ANY(%(ids)s::bigint[]) AND status + 0 = %(inflight)s AND consumer_id + 0 = %(consumer)s
RETURNING id, deadline, retry_count
"""
# ``+ 0``: status and consumer are checked on the row, not looked up (primary key only): with the
# statistics of a smaller table the planner otherwise walked the consumer's in-flight jobs through
# job_consumer_status to find one id.
_EXTEND_SQL = typed_sql(statuses_inline(_EXTEND_SQL), {"timeout": "float8", "inc": "float8", "inflight": "smallint",
                                      "consumer": "bigint"})


def jobs_extend(*, consumer_pk: int, job_ids: Sequence[int], incremental_timeout: float | None = None,
                connection_timeout: float | None = None) -> dict[int, tuple]:
    """Work in progress: push the deadline of in-flight jobs to now + stopTimeout + rationalDelay +
    IncrementalTimeout (never earlier than it was). Not a transition: status and retry count stay.
    Returns {job_id: (deadline, retry_count)} for the jobs that are INFLIGHT and the consumer's."""
    if not job_ids:
        return {}
    rows = prepared_fetchall(_EXTEND_SQL, {"ids": list(job_ids), "inflight": INFLIGHT, "consumer": consumer_pk,
                                           "timeout": inflight_timeout(0, connection_timeout),
                                           "inc": incremental_timeout})
    return {row[0]: (row[1], row[2]) for row in rows}


# --- push claim (all push consumers at once) ----------------------------------------------------

PUSH_CLAIM_LOCK = 0x70757368  # pg_advisory_xact_lock key serializing push claims ("push")

# Run first in a push dispatcher's transaction (record outcomes + claim), measured on the 2-core
# machine (median claim of 10 jobs: 2.1 ms planned every time, 1.1 ms prepared and generic):
# - plan_cache_mode: reuse the prepared generic plans (PostgreSQL otherwise keeps re-planning
#   these statements, as its cost estimate favours custom plans); the statuses are inlined in the
#   SQL so the generic plans still use the partial indexes.
# - synchronous_commit off: claims and outcomes need no WAL flush before the dispatcher goes on.
#   If a crash loses the last few milliseconds of them, those jobs are QUEUED or INFLIGHT again
#   and are delivered (again): at-least-once holds, and no message is lost (publishing commits
#   synchronously).
PUSH_TRANSACTION_SETUP = ("SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
                          "set_config('synchronous_commit', 'off', true)")


def _bound_cursor():
    """A psycopg cursor with server-side parameter binding on Django's connection (and in its
    transaction), for the push hot path: Django's default client-side binding quotes every array
    element into the SQL text (~0.2 ms per statement here), while bound parameters travel as-is.
    Its statements are executed with ``prepare=True`` (Django turns psycopg's automatic
    preparation off), so the planning of the claim (~0.7 ms) is paid once per connection when
    the caller also asks for generic plans (``PUSH_TRANSACTION_SETUP``)."""
    import psycopg

    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)

# Circuit breaker (jobs.circuit; ``cb`` is the consumer's consumers_circuit row, NULL while it never
# failed): OPEN or HALF_OPEN leaves room for one probe once ``next_probe_at`` has passed and nothing
# is in flight; after ``failures`` consecutive failures (below the threshold) at most threshold -
# failures requests are out at once. NULL (no cap) when the breaker is off or never failed.
CIRCUIT_CAP = f"""CASE WHEN c.circuit_breaker_failures > 0 THEN
                CASE WHEN cb.state IN ({CB_OPEN}, {CB_HALF_OPEN}) THEN CASE WHEN cb.next_probe_at <= now() THEN 1 ELSE 0 END
                     WHEN cb.failures > 0 THEN GREATEST(c.circuit_breaker_failures - cb.failures, 1) END END"""

# Statuses are inlined, not parameters: a cached generic plan can then use the partial indexes
# (WHERE status = 1001 ...), so PostgreSQL stops re-planning this statement (0.7 ms) on every claim.
_CLAIM_PUSH_SQL = """
WITH k AS MATERIALIZED (
    SELECT c.id, c.updated_at,
           LEAST(c.max_in_flight, c.max_ack_pending, {CIRCUIT_CAP})
             - (SELECT count(*) FROM jobs_job i
                 WHERE i.consumer_id = c.id AND i.status = {INFLIGHT}) AS room,
           c.max_deliveries_per_second AS rate, c.ordered,
           COALESCE(c.connection_timeout, %(conn_timeout)s) + 0.25 + %(rational)s AS ttl,
           GREATEST(extract(epoch FROM p.tat - now()), 0) AS lag,
           c.circuit_breaker_failures > 0 AND cb.state IN ({CB_OPEN}, {CB_HALF_OPEN}) AS probing,
           c.circuit_breaker_probe_seconds AS probe, COALESCE(cb.failures > 0 OR cb.state <> {CB_CLOSED}, false) AS cb_dirty
      FROM consumers_consumer c
      LEFT JOIN jobs_pushpace p ON p.consumer_id = c.id
      LEFT JOIN consumers_circuit cb ON cb.consumer_id = c.id  -- circuit breaker (jobs.circuit)
     WHERE c.type = 'push' AND NOT c.paused  -- flow control: a paused consumer gets nothing
), r AS MATERIALIZED (
    -- room: maxInFlight minus what is in flight now (any process), capped by the GCRA pacing
    -- of maxDeliveriesPerSecond (bursts of rate/20, at least 1)
    SELECT id, updated_at, rate, ttl, lag, ordered, probing, probe, cb_dirty,
           LEAST(room, %(limit)s,
                 CASE WHEN rate IS NULL OR rate <= 0 THEN %(limit)s
                      ELSE floor(GREATEST(1, ceil(rate / 20.0)) - COALESCE(lag, 0) * rate)::int END) AS room
      FROM k
), cand AS MATERIALIZED (
    SELECT x.id, x.priority
      FROM r CROSS JOIN LATERAL (
          SELECT y.id, y.priority FROM (
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = {QUEUED} AND j.retry_count = 0
                  AND j.next_attempt_at <= now() AND {GATE}
                  AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
                ORDER BY j.priority DESC, j.id LIMIT r.room)
              UNION ALL
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = {QUEUED} AND j.retry_count > 0
                  AND j.next_attempt_at <= now() AND {GATE}
                  AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
                ORDER BY j.next_attempt_at LIMIT r.room)
          ) y ORDER BY y.priority DESC, y.id LIMIT r.room
      ) x
     WHERE r.room > 0
     ORDER BY x.priority DESC, x.id
     LIMIT %(limit)s
), u AS (
    -- Lock and move by primary key (id = ANY(array)): the plan then never depends on the
    -- table's statistics (a cached generic plan built on a fresh table once scanned every
    -- queued job here).
    UPDATE jobs_job j SET status = {INFLIGHT}, status_changed_at = now(),
                          deadline = now() + r.ttl * interval '1 second'
      FROM (SELECT p.id, p.consumer_id FROM jobs_job p
             WHERE p.id = ANY(ARRAY(SELECT id FROM cand)) AND p.status = {QUEUED}
               FOR UPDATE SKIP LOCKED) pick
      JOIN r ON r.id = pick.consumer_id
     WHERE j.id = pick.id
    RETURNING j.id, j.consumer_id, j.message_id, j.priority, j.retry_count, j.partition_id, j.gate, j.payload
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {QUEUED}, {INFLIGHT}, retry_count, %(reason)s, now() FROM u
), pace AS (
    INSERT INTO jobs_pushpace (consumer_id, tat)
    SELECT u.consumer_id, now() + (max(r.lag) + count(*) / max(r.rate)) * interval '1 second'
      FROM u JOIN r ON r.id = u.consumer_id
     WHERE r.rate > 0
     GROUP BY u.consumer_id
    ON CONFLICT (consumer_id) DO UPDATE SET tat = EXCLUDED.tat
), probe AS (
    -- circuit breaker: the job claimed for an OPEN circuit is its probe (HALF_OPEN until recorded)
    UPDATE consumers_circuit cb SET state = {CB_HALF_OPEN}, next_probe_at = now() + r.probe * interval '1 second'
      FROM r WHERE cb.consumer_id = r.id AND r.probing AND r.id IN (SELECT consumer_id FROM u)
)
SELECT u.id, u.consumer_id, u.priority, u.retry_count, m.message_id, COALESCE(u.payload, m.payload),
       m.content_type, m.headers, r.updated_at,
       CASE WHEN u.partition_id IS NOT NULL
            THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type, r.cb_dirty
  FROM u JOIN broker_message m ON m.id = u.message_id JOIN r ON r.id = u.consumer_id
 ORDER BY u.priority DESC, u.id
""".replace("{GATE}", partition_gate_sql(
    "j", ordered="r.ordered", lease="AND pt.owner = %(worker)s AND pt.lease_until > now()",
)).replace("{CIRCUIT_CAP}", CIRCUIT_CAP).format(
    QUEUED=QUEUED, INFLIGHT=INFLIGHT, CB_OPEN=CB_OPEN, CB_HALF_OPEN=CB_HALF_OPEN, CB_CLOSED=CB_CLOSED)
_CLAIM_PUSH_SQL = typed_sql(_CLAIM_PUSH_SQL, {"limit": "int", "conn_timeout": "float8", "rational": "float8",
                                              "reason": "text", "worker": "text"})


@dataclass
class PushJob:
    id: int
    consumer_pk: int
    priority: int
    retry_count: int
    message_id: str
    payload: bytes
    content_type: str
    headers: dict
    consumer_updated_at: object
    partition_key: str | None = None
    gate: int = 0
    message_type: str | None = None  # filters: sent as X-Broker-Message-Type
    circuit_dirty: bool = False  # its consumer's circuit was counting failures or open when claimed


def _headers_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def jobs_claim_push(*, limit: int, reason: str = "push", worker: str = "") -> list[PushJob]:
    """Claim up to ``limit`` due QUEUED jobs across every push consumer: priority DESC, then
    oldest first, never past a consumer's ``maxInFlight`` (counted over all processes) or its
    ``maxDeliveriesPerSecond`` pacing. Moves them to INFLIGHT with a deadline of the consumer's
    stopTimeout + rationalDelay.

    Race-free by a transaction-level advisory lock taken *before* the claim statement: push
    claims run one at a time database-wide, and each one's fresh READ COMMITTED snapshot sees
    every earlier claim, so two dispatchers never both fill the same free slot (a single
    statement could not: its snapshot predates any lock it waits for). A claim takes about a
    millisecond, so the serialization costs nothing at our rates; acks need no lock (they only
    free room). Pull consumers' jobs are never touched (``type = 'push'``).

    Runs in the caller's transaction when there is one (the dispatcher records the previous
    batch's outcomes and claims the next in one transaction). Partitioned jobs only of
    partitions ``worker`` holds a live lease on (jobs.partitions).
    """
    if limit <= 0:
        return []
    params = {
        "limit": int(limit),
        "conn_timeout": float(settings.BROKER_CONNECTION_TIMEOUT),
        "rational": float(settings.BROKER_RATIONAL_DELAY),
        "reason": reason[:32],
        "worker": worker or "",
    }
    import json

    from django.db import transaction

    with transaction.atomic(savepoint=False), _bound_cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [PUSH_CLAIM_LOCK], prepare=True)
        cur.execute(_CLAIM_PUSH_SQL, params, prepare=True)
        rows = cur.fetchall()
    return [
        PushJob(id=r[0], consumer_pk=r[1], priority=r[2], retry_count=r[3], message_id=r[4],
                payload=bytes(r[5]), content_type=r[6], consumer_updated_at=r[8],
                partition_key=r[9], gate=r[10] or 0, message_type=r[11], circuit_dirty=r[12],
                # Django's psycopg setup leaves jsonb undecoded (JSONField decodes it)
                headers=_headers_dict(json.loads(r[7]) if isinstance(r[7], str) else r[7]))
        for r in rows
    ]


_PULL_MOVE_AUTH_SQL = """
WITH a AS (
    SELECT ch.id AS ch_pk, ch.token AS ch_token, c.id AS c_pk, c.token AS c_token, c.type AS c_type,
           c.max_retry, j.id AS j_id, j.status AS j_status, j.retry_count, j.incremental_timeout,
           j.deadline < now() AS expired
      FROM broker_channel ch
      LEFT JOIN consumers_consumer c ON c.channel_id = ch.id AND c.consumer_id = %(consumer)s
      LEFT JOIN jobs_job j ON j.id = %(job)s AND j.consumer_id = c.id
     WHERE ch.channel_id = %(channel)s
), u AS (
    UPDATE jobs_job j SET
        status = %(to_s)s,
        retry_count = j.retry_count + CASE WHEN j.status = %(dead)s THEN 1 ELSE 0 END,
        status_changed_at = now(),
        deadline = CASE WHEN %(to_s)s = %(inflight)s
                        THEN now() + (%(timeout)s + COALESCE(%(inc)s, j.incremental_timeout)) * interval '1 second'
                   END,
        incremental_timeout = COALESCE(%(inc)s, j.incremental_timeout)
      FROM a
     WHERE j.id = a.j_id AND j.consumer_id = a.c_pk AND a.c_type = 'pull'
       AND j.status = a.j_status AND a.j_status = ANY(%(from_s)s::smallint[])
       AND (%(to_s)s <> %(inflight)s OR j.expires_at IS NULL OR j.expires_at > now())  -- expiry
       AND md5(a.ch_token) = md5(%(ch_token)s) AND md5(a.c_token) = md5(%(c_token)s)
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT u.id, a.j_status, u.status, u.retry_count, %(reason)s, now() FROM u CROSS JOIN a
)
SELECT a.*, (SELECT count(*) FROM u), (SELECT u.partition_id FROM u) FROM a
"""
_PULL_MOVE_AUTH_SQL = typed_sql(statuses_inline(_PULL_MOVE_AUTH_SQL), {
    "consumer": "text", "job": "bigint", "channel": "text", "to_s": "smallint", "dead": "smallint",
    "inflight": "smallint", "timeout": "float8", "inc": "float8", "ch_token": "text", "c_token": "text",
    "reason": "text"})


def job_move_pull_authenticated(*, channel_id: str, consumer_id: str, job_id: int | None,
                                channel_token: str | None, consumer_token: str | None,
                                from_statuses: Sequence[int], to_status: int,
                                incremental_timeout: float | None = None, reason: str = "pull",
                                connection_timeout: float | None = None) -> tuple[tuple | None, bool]:
    """The spec path's state change in one round trip: read the auth row (channel, consumer,
    job) and, in the same statement, move the job if the tokens match, the consumer is a pull
    consumer and the job is in one of ``from_statuses`` (DEAD -> INFLIGHT adds a retry).

    The tokens are compared as md5 digests in SQL (timing reveals nothing usable about the
    secret); the caller still checks the returned tokens in constant time and decides the HTTP
    answer from the row as it was before the move. Returns (auth row, moved) where the row has
    ``jobs.pull._AUTH_SQL``'s columns, or None for an unknown channel."""
    row = _pull_move_auth_run(_PULL_MOVE_AUTH_SQL, 11, channel_id=channel_id, consumer_id=consumer_id,
                              job_id=job_id, channel_token=channel_token, consumer_token=consumer_token,
                              from_statuses=from_statuses, to_status=to_status,
                              incremental_timeout=incremental_timeout, reason=reason,
                              connection_timeout=connection_timeout)
    if row is None:
        return None, False
    return row[:11], bool(row[11])


def _pull_move_auth_run(sql: str, moved_col: int, *, channel_id, consumer_id, job_id, channel_token,
                        consumer_token, from_statuses, to_status, incremental_timeout, reason,
                        connection_timeout) -> tuple | None:
    """Run one of the spec path's auth-and-move statements (plain or grouped): check the
    transition, execute, settle the job's partition when it finished. ``moved_col`` is the
    statement's "moved" column; the partition id follows it. None for an unknown channel."""
    for from_status in from_statuses:
        if (from_status, to_status) not in ALLOWED:
            raise IllegalTransition(f"{from_status} -> {to_status}")
    rows = prepared_fetchall(sql, {
        "channel": channel_id, "consumer": consumer_id, "job": job_id,
        "ch_token": channel_token, "c_token": consumer_token,
        "from_s": list(from_statuses), "to_s": to_status, "inc": incremental_timeout,
        "dead": DEAD, "inflight": INFLIGHT, "timeout": inflight_timeout(0, connection_timeout),
        "reason": reason[:32],
    })
    row = rows[0] if rows else None
    if row is not None and row[moved_col] and to_status in (DELIVERED, DEAD):
        _settle_on_commit([row[moved_col + 1]])
    return row


# Priority groups (jobs.groups): on a consumer with a priority policy every claim goes
# through its group dispatcher, so the spec path's per-job INFLIGHT move is refused there. Same
# statement as above plus the consumer's policy in the auth row and one guard on the move.
_PULL_MOVE_AUTH_GROUPED_SQL = statuses_inline(_PULL_MOVE_AUTH_SQL).replace(
    "j.deadline < now() AS expired\n", "j.deadline < now() AS expired, c.priority_policy AS c_policy\n", 1,
).replace(
    "       AND md5(a.ch_token)",
    f"       AND (a.c_policy = 'none' OR %(to_s)s::smallint <> {INFLIGHT})\n       AND md5(a.ch_token)", 1,
)
assert _PULL_MOVE_AUTH_GROUPED_SQL.count("c_policy") == 2, "_PULL_MOVE_AUTH_SQL changed: update the grouped copy"


def job_move_pull_authenticated_grouped(*, channel_id: str, consumer_id: str, job_id: int | None,
                                        channel_token: str | None, consumer_token: str | None,
                                        from_statuses: Sequence[int], to_status: int,
                                        incremental_timeout: float | None = None, reason: str = "pull",
                                        connection_timeout: float | None = None) -> tuple[tuple | None, bool, str]:
    """``job_move_pull_authenticated`` that never moves a job to INFLIGHT on a consumer with a
    priority policy. Returns (auth row, moved, the consumer's priority policy or '')."""
    row = _pull_move_auth_run(_PULL_MOVE_AUTH_GROUPED_SQL, 12, channel_id=channel_id, consumer_id=consumer_id,
                              job_id=job_id, channel_token=channel_token, consumer_token=consumer_token,
                              from_statuses=from_statuses, to_status=to_status,
                              incremental_timeout=incremental_timeout, reason=reason,
                              connection_timeout=connection_timeout)
    if row is None:
        return None, False, ""
    return row[:11], bool(row[12]), row[11] or ""


_ACK_SQL = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(to_s)s::smallint[], %(delay)s::float8[]) AS v(id, to_s, delay)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = %(queued)s AND j.retry_count + 1 > %(max_retry)s THEN %(dead)s ELSE v.to_s END,
        retry_count = j.retry_count + CASE WHEN v.to_s = %(queued)s THEN 1 ELSE 0 END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.to_s = %(queued)s THEN now() + COALESCE(v.delay, 0) * interval '1 second'
                               ELSE j.next_attempt_at END,
        deadline = NULL
      FROM v
     WHERE j.id = v.id AND j.status = %(inflight)s AND j.consumer_id = %(consumer)s
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, %(inflight)s, status, retry_count, %(reason)s, now() FROM u
), n AS (
    SELECT pg_notify('broker_jobs', %(consumer)s::text) FROM u WHERE status = %(queued)s LIMIT 1
)
SELECT v.id, u.status, u.retry_count, c.status, (SELECT count(*) FROM n), u.partition_id
  FROM v LEFT JOIN u ON u.id = v.id
         LEFT JOIN jobs_job c ON u.id IS NULL AND c.id = v.id AND c.consumer_id = %(consumer)s
"""
_ACK_SQL = typed_sql(statuses_inline(_ACK_SQL), {"queued": "smallint", "max_retry": "int", "dead": "smallint", "inflight": "smallint",
                                "consumer": "bigint", "reason": "text"})


def jobs_ack_inflight(*, consumer_pk: int, job_ids: Sequence[int], to_statuses: Sequence[int],
                      delays: Sequence[float | None], max_retry: int, reason: str = "ack") -> dict[int, tuple]:
    """A pull consumer's outcomes for many in-flight jobs in one statement (the batch ack):
    INFLIGHT -> DELIVERED / DEAD, or QUEUED (negative acknowledgement: retry + 1, due after the
    delay, DEAD past ``max_retry``; waiting pulls are notified). Guarded by INFLIGHT and the
    consumer. Returns {job_id: (moved, status, retry_count)}: for a job that did not move,
    ``status`` is its current one (None when it is not this consumer's)."""
    for to_status in set(to_statuses):
        if (INFLIGHT, to_status) not in ALLOWED:
            raise IllegalTransition(f"{INFLIGHT} -> {to_status}")
    if not job_ids:
        return {}
    rows = prepared_fetchall(_ACK_SQL, {
        "ids": list(job_ids), "to_s": list(to_statuses), "delay": list(delays), "consumer": consumer_pk,
        "max_retry": int(max_retry), "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT,
        "reason": reason[:32],
    })
    _settle_on_commit(r[5] for r in rows if r[1] is not None and r[1] != QUEUED)
    return {r[0]: (True, r[1], r[2]) if r[1] is not None else (False, r[3], None) for r in rows}


# Circuit breaker (jobs.circuit) in the push record: a failed probe (its consumer's circuit is
# HALF_OPEN: the only job in flight) goes back to QUEUED without spending a retry; each consumer's
# consecutive failures add up (a success in the batch restarts the count) and reaching the
# threshold opens the circuit. ``since`` moves only when the circuit opens or closes (a failed probe
# keeps it open since then), so the rows returned as changed are the advisories to raise.
# consumers_circuit is read and written by primary key.
_PROBE = f"""EXISTS (SELECT 1 FROM consumers_circuit pc WHERE pc.consumer_id = j.consumer_id
                                                     AND pc.state = {CB_HALF_OPEN})"""
_CB_FAILURES = "CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END"
_CB_STATE = (f"CASE WHEN k.circuit_breaker_failures > 0 AND {_CB_FAILURES} >= k.circuit_breaker_failures "
             f"THEN {CB_OPEN} ELSE {CB_CLOSED} END")

_PUSH_RECORD_SQL = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(to_s)s::smallint[], %(delay)s::float8[], %(max_retry)s::int[])
           AS v(id, to_s, delay, max_retry)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = {QUEUED} AND j.retry_count + 1 > v.max_retry AND NOT {PROBE} THEN {DEAD}
                      ELSE v.to_s END,
        retry_count = CASE WHEN v.to_s = {QUEUED} AND NOT {PROBE} THEN j.retry_count + 1 ELSE j.retry_count END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.to_s = {QUEUED} THEN now() + v.delay * interval '1 second'
                               ELSE j.next_attempt_at END,
        deadline = NULL
      FROM v
     WHERE j.id = v.id AND j.id = ANY(%(ids)s::bigint[]) AND j.status = {INFLIGHT}  -- by primary key
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {INFLIGHT}, status, retry_count, 'push', now() FROM u
), a AS (
INSERT INTO jobs_deliveryattempt (job_id, attempt, started_at, duration_ms, status_code, response_excerpt,
                                  error, request_id, outcome)
SELECT a.id, a.attempt, now() - a.age * interval '1 second', a.duration_ms, a.status_code, a.excerpt,
       a.error, a.request_id, a.outcome
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ages)s::float8[], %(durations)s::float8[],
              %(codes)s::int[], %(excerpts)s::text[], %(errors)s::text[], %(request_ids)s::text[],
              %(outcomes)s::text[])
       AS a(id, attempt, age, duration_ms, status_code, excerpt, error, request_id, outcome)
), cbx AS (
    -- circuit breaker (jobs.circuit): per consumer of the batch, whether an attempt succeeded and
    -- how many failed after the last success
    SELECT * FROM unnest(%(cb_consumers)s::bigint[], %(cb_ok)s::bool[], %(cb_fails)s::int[]) AS x(consumer_id, ok, fails)
), cbu AS (
    UPDATE consumers_circuit cb SET
        failures = {CB_FAILURES}, state = {CB_STATE},
        since = CASE WHEN ({CB_STATE} = {CB_CLOSED}) <> (cb.state = {CB_CLOSED}) THEN now() ELSE cb.since END,
        next_probe_at = CASE WHEN {CB_STATE} = {CB_OPEN} AND cb.state <> {CB_OPEN}
                             THEN now() + k.circuit_breaker_probe_seconds * interval '1 second' ELSE cb.next_probe_at END
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE cb.consumer_id = x.consumer_id AND (x.fails > 0 OR cb.failures > 0 OR cb.state <> {CB_CLOSED})
    RETURNING cb.consumer_id, cb.state, cb.since = now() AS changed
), cbi AS (
    INSERT INTO consumers_circuit (consumer_id, state, since, failures, next_probe_at)
    SELECT x.consumer_id, CASE WHEN x.fails >= k.circuit_breaker_failures THEN {CB_OPEN} ELSE {CB_CLOSED} END, now(),
           x.fails, now() + k.circuit_breaker_probe_seconds * interval '1 second'
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE x.fails > 0 AND k.circuit_breaker_failures > 0
       AND NOT EXISTS (SELECT 1 FROM consumers_circuit e WHERE e.consumer_id = x.consumer_id)
    ON CONFLICT (consumer_id) DO UPDATE SET failures = consumers_circuit.failures + EXCLUDED.failures
    RETURNING consumer_id, state
)
-- partitions to settle (jobs.partitions): nothing to return for non-partitioned jobs; circuits
-- that changed state (advisories)
SELECT DISTINCT partition_id, NULL::bigint, NULL::smallint FROM u WHERE partition_id IS NOT NULL AND status <> {QUEUED}
UNION ALL SELECT NULL, consumer_id, state FROM cbu WHERE changed
UNION ALL SELECT NULL, consumer_id, state FROM cbi WHERE state = {CB_OPEN}
""".replace("{PROBE}", _PROBE).replace("{CB_STATE}", _CB_STATE).replace("{CB_FAILURES}", _CB_FAILURES).format(
    QUEUED=QUEUED, INFLIGHT=INFLIGHT, DEAD=DEAD, CB_OPEN=CB_OPEN, CB_CLOSED=CB_CLOSED)  # inlined: see _CLAIM_PUSH_SQL


@dataclass
class PushOutcome:
    """A finished push attempt. ``to_status``: DELIVERED, DEAD, or QUEUED (retry + 1 after
    ``delay`` seconds; DEAD instead past ``max_retry``). The rest is the attempt's record."""

    job_id: int
    to_status: int
    attempt: int
    age: float  # seconds since the attempt started
    duration_ms: float
    status_code: int | None
    excerpt: str
    error: str
    request_id: str
    outcome: str
    delay: float | None = None
    max_retry: int | None = None


@dataclass
class CircuitTally:
    """One consumer's attempts in a recorded batch, for its circuit breaker: ``ok`` an attempt
    succeeded, ``fails`` the failed attempts after the last success (all of them without one)."""

    consumer_pk: int
    ok: bool
    fails: int


def jobs_push_record(*, outcomes: Sequence[PushOutcome], circuits: Sequence[CircuitTally] = ()) -> list[tuple]:
    """Record finished push attempts in one statement: INFLIGHT -> DELIVERED / QUEUED / DEAD for
    each job still in flight (guarded by the status, so a job the timeout sweep already moved
    is left alone), its transition row, and every attempt's row (attempts are facts, recorded
    even when the job moved meanwhile). One statement instead of a jobs_move plus an INSERT: a
    dispatcher records and claims in every transaction, and round trips are its cost.

    ``circuits``: the batch's tallies per consumer for the circuit breaker, applied in the same
    statement. Returns the circuits whose state changed, as (consumer pk, new state)."""
    if not outcomes:
        return []
    for o in outcomes:
        if (INFLIGHT, o.to_status) not in ALLOWED:
            raise IllegalTransition(f"{INFLIGHT} -> {o.to_status}")
    params = {
        "ids": [o.job_id for o in outcomes],
        "to_s": [o.to_status for o in outcomes],
        "delay": [o.delay for o in outcomes],
        "max_retry": [o.max_retry for o in outcomes],
        "attempts": [o.attempt for o in outcomes],
        "ages": [o.age for o in outcomes],
        "durations": [o.duration_ms for o in outcomes],
        "codes": [o.status_code for o in outcomes],
        "excerpts": [o.excerpt for o in outcomes],
        "errors": [o.error for o in outcomes],
        "request_ids": [o.request_id for o in outcomes],
        "outcomes": [o.outcome for o in outcomes],
        "cb_consumers": [t.consumer_pk for t in circuits],
        "cb_ok": [t.ok for t in circuits],
        "cb_fails": [t.fails for t in circuits],
    }
    with _bound_cursor() as cur:
        cur.execute(_PUSH_RECORD_SQL, params, prepare=True)
        rows = cur.fetchall()
    _settle_on_commit(row[0] for row in rows)
    return [(row[1], row[2]) for row in rows if row[1] is not None]


# --- partitions: handler-driven gate moves -------------------------------------------------------

_GATE_MOVE_SQL = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(gates)s::int[], %(payloads)s::bytea[], %(keep)s::bool[])
           AS v(id, gate, payload, keep)
), u AS (
    UPDATE jobs_job j SET
        status = {QUEUED}, gate = v.gate, retry_count = 0,
        payload = CASE WHEN v.keep THEN j.payload ELSE v.payload END,
        status_changed_at = now(), next_attempt_at = now(), deadline = NULL
      FROM v
     WHERE j.id = v.id AND j.status + 0 = {INFLIGHT} AND j.partition_id IS NOT NULL AND v.gate > j.gate
       AND (%(consumer)s::bigint IS NULL OR j.consumer_id + 0 = %(consumer)s::bigint)  -- by primary key only
    RETURNING j.id, j.retry_count, j.partition_id, j.consumer_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {INFLIGHT}, {QUEUED}, retry_count, 'gate', now() FROM u
), n AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ','))
      FROM u HAVING count(*) > 0
)
SELECT id, partition_id, (SELECT count(*) FROM n) FROM u
""".format(QUEUED=QUEUED, INFLIGHT=INFLIGHT)


@dataclass
class GateMove:
    """A partitioned job's handler said "not done, continue at ``gate``" (> its current gate),
    optionally with a new payload for this job only (``payload`` None keeps the current one)."""

    job_id: int
    gate: int
    payload: bytes | None = None


def jobs_move_gate(*, moves: Sequence[GateMove], consumer_pk: int | None = None) -> dict[int, int]:
    """INFLIGHT -> QUEUED at a higher gate of the job's partition (history reason ``gate``; retry
    count reset: it is the next step, not a retry), due at once. One statement; guarded by
    INFLIGHT, a partition and a greater gate. Returns {job_id: partition_id} of the jobs moved;
    their partitions are settled after commit (the old gate may be finished now)."""
    if not moves:
        return {}
    with connection.cursor() as cur:
        cur.execute(_GATE_MOVE_SQL, {
            "ids": [m.job_id for m in moves], "gates": [int(m.gate) for m in moves],
            "payloads": [m.payload for m in moves], "keep": [m.payload is None for m in moves],
            "consumer": consumer_pk,
        })
        rows = cur.fetchall()
    _settle_on_commit(r[1] for r in rows)
    return {r[0]: r[1] for r in rows}


# --- replay (jobs.replay) ------------------------------------------------------------------------

# One chunk of a replay: the next ``limit`` messages of the channel in the window, walked by keyset
# on message_channel_received (channel_id, received_at, id); this consumer's job of each message
# found through job_unique_per_consumer (message_id, consumer_id), then moved by primary key.
# DELIVERED (unless only_failed) and DEAD jobs go back to QUEUED, retry count 0 (rows locked SKIP
# LOCKED: a job some other statement holds right now is skipped, never waited for); a message
# without a job of this consumer gets a fresh QUEUED job (unless only_failed). QUEUED and INFLIGHT
# jobs are skipped, and so are partitioned jobs and messages (a job put back below its partition's
# gate could never run again). Every move and every new job gets a history row, reason ``replay``.
_REPLAY_CHUNK_SQL = """
WITH m AS MATERIALIZED (
    -- a range on channel_id keeps it in the sort keys: only message_channel_received gives this order
    SELECT id, priority, received_at, type, expires_at FROM broker_message
     WHERE channel_id BETWEEN %(channel)s AND %(channel)s
       AND (received_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
       AND received_at <= %(until)s::timestamptz
     ORDER BY channel_id, received_at, id LIMIT %(limit)s
), cur AS MATERIALIZED (
    -- per message by job_unique_per_consumer (LIMIT 1: a nested loop, never a hash of every job)
    SELECT j.id, j.message_id, j.status, j.partition_id, j.expires_at
      FROM m CROSS JOIN LATERAL (
          SELECT j.id, j.message_id, j.status, j.partition_id, j.expires_at FROM jobs_job j
           WHERE j.message_id = m.id AND j.consumer_id = %(consumer)s LIMIT 1) j
), pick AS MATERIALIZED (
    SELECT p.id, p.status FROM jobs_job p
     WHERE p.id = ANY(ARRAY(SELECT id FROM cur WHERE partition_id IS NULL  -- an expired message stays dead
                                                 AND (expires_at IS NULL OR expires_at > now())
                                                 AND (status = {DEAD} OR (status = {DELIVERED} AND NOT %(only_failed)s))))
       AND p.status + 0 IN ({DEAD}, {DELIVERED}) AND p.partition_id IS NULL
       FOR UPDATE SKIP LOCKED
), ud AS (
    UPDATE jobs_job j SET status = {QUEUED}, retry_count = 0, status_changed_at = now(), next_attempt_at = now(),
                          deadline = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM pick WHERE status = {DELIVERED})) AND j.status + 0 = {DELIVERED}
    RETURNING j.id
), ux AS (
    UPDATE jobs_job j SET status = {QUEUED}, retry_count = 0, status_changed_at = now(), next_attempt_at = now(),
                          deadline = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM pick WHERE status = {DEAD})) AND j.status + 0 = {DEAD}
    RETURNING j.id
), ins AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                          incremental_timeout, status_changed_at, created_at, expires_at)
    SELECT src.id, %(consumer)s, %(channel)s, {QUEUED}, src.priority, 0, now(), 0, now(), now(), src.expires_at
      FROM m src JOIN consumers_consumer c ON c.id = %(consumer)s LEFT JOIN LATERAL (
          SELECT 1 AS yes FROM jobs_job o WHERE o.message_id = src.id AND o.partition_id IS NOT NULL LIMIT 1) pt ON true
     WHERE NOT %(only_failed)s AND pt.yes IS NULL
       AND (src.expires_at IS NULL OR src.expires_at > now())
       AND {TYPE_FILTER}  -- the consumer's messageTypes, as at fan-out
       AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.message_id = src.id)
     ORDER BY src.id
    ON CONFLICT (message_id, consumer_id) DO NOTHING
    RETURNING id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {DELIVERED}, {QUEUED}, 0, 'replay', now() FROM ud
    UNION ALL SELECT id, {DEAD}, {QUEUED}, 0, 'replay', now() FROM ux
    UNION ALL SELECT id, NULL, {QUEUED}, 0, 'replay', now() FROM ins
), n AS (
    SELECT pg_notify('broker_jobs', %(consumer)s::text)
     WHERE EXISTS (SELECT 1 FROM ud) OR EXISTS (SELECT 1 FROM ux) OR EXISTS (SELECT 1 FROM ins)
), last AS (
    SELECT received_at, id FROM m ORDER BY received_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM ud) + (SELECT count(*) FROM ux) + (SELECT count(*) FROM ins),
       (SELECT received_at FROM last), (SELECT id FROM last), (SELECT count(*) FROM n)
""".format(QUEUED=QUEUED, DELIVERED=DELIVERED, DEAD=DEAD, TYPE_FILTER=_TYPE_FILTER)
REPLAY_MOVES = ((DELIVERED, QUEUED), (DEAD, QUEUED))


@dataclass
class ReplayChunk:
    """What one chunk did: messages walked, jobs queued (moved or new), and where it stopped
    (the keyset of the last message; None when the window is exhausted)."""

    messages: int
    queued: int
    after_at: object
    after_id: int | None


def jobs_replay_chunk(*, channel_pk: int, consumer_pk: int, after_at, after_id: int, until,
                      only_failed: bool, limit: int) -> ReplayChunk:
    """One chunk of a replay, one statement (its own transaction outside one), see _REPLAY_CHUNK_SQL."""
    for move in REPLAY_MOVES:
        if move not in ALLOWED:
            raise IllegalTransition(f"{move[0]} -> {move[1]}")
    with connection.cursor() as cur:
        cur.execute(_REPLAY_CHUNK_SQL, {"channel": channel_pk, "consumer": consumer_pk, "after_at": after_at,
                                        "after_id": after_id, "until": until, "only_failed": bool(only_failed),
                                        "limit": int(limit)})
        walked, queued, last_at, last_id, _ = cur.fetchone()
    return ReplayChunk(messages=int(walked), queued=int(queued), after_at=last_at, after_id=last_id)
