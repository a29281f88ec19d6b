"""The job state machine: the only module that writes ``jobs_job.status``.

The moves and their kinds are the transition table in ``jobs/transitions.py``: every writer here
checks its moves there before any SQL, and the database enforces the same table.

Every move is one conditional UPDATE guarded by the expected status, so two actors can never
both win; each UPDATE sets ``last_reason`` and the history trigger on ``jobs_job`` (migration 0017)
appends the ``jobs_jobtransition`` rows, the one history writer. Hot paths (claim,
ack, sweep) are single batched SQL statements over ``unnest`` arrays rather than ORM loops:
measured on this machine, batched raw claims/acks run ~40k jobs/s versus ~0.4k/s per-job ORM.
Time always comes from the database (``now()``), never from a worker's clock.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from django.conf import settings
from django.db import transaction

from broker.db.run import (  # noqa: F401  (PLAN_CACHE_MODE, connection_plan_setup: re-exported)
    PLAN_CACHE_MODE, bound_cursor, connection_plan_setup, query_fetchall, query_fetchone, transition_errors)
from broker.db.errors import IllegalTransition  # noqa: F401  (re-exported: callers catch it from here)
from jobs.queries import Q
from jobs.transitions import ALLOWED, DEAD, DELIVERED, GONE, INFLIGHT, QUEUED, transition_check, transitions_check  # noqa: F401


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




def jobs_move(*, moves: Sequence[Move], reason: str, consumer_pk: int | None = None) -> dict[int, tuple]:
    """Apply many transitions in one statement; returns {job_id: (status, retry_count, deadline)}
    for the jobs that moved. A job absent from the result was not in its expected state (or
    belongs to another consumer): the caller decides what to answer.
    """
    transitions_check((m.from_status, m.to_status) for m in moves)
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
    rows = query_fetchall(Q.move, params)
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

def _settle_on_commit(partition_ids) -> None:
    """Settle the partitions of jobs that just finished (DELIVERED / DEAD / moved), after the
    transaction commits: a settle must see every committed move, and the last committer of a
    partition's moves then always sees all of them (jobs.partitions.partitions_settle)."""
    ids = sorted({int(i) for i in partition_ids if i is not None})
    if not ids:
        return

    def settle() -> None:
        from jobs.partitions import partitions_settle

        partitions_settle(partition_ids=ids)

    transaction.on_commit(settle, robust=True)


# --- claims ----------------------------------------------------------------------------------------




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


def claimed_jobs(rows) -> list[ClaimedJob]:
    """Rows shaped like ``_CLAIM_TAIL``'s result (id, priority, retry_count, incremental_timeout,
    deadline, message_id, payload, content_type, headers[, partition key, gate]) as ClaimedJob objects."""
    return [
        ClaimedJob(id=r[0], priority=r[1], retry_count=r[2], incremental_timeout=r[3], deadline=r[4],
                   message_id=r[5], payload=bytes(r[6]), content_type=r[7], headers=_headers(r[8]),
                   partition_key=r[9] if len(r) > 9 else None, gate=r[10] if len(r) > 10 and r[10] else 0)
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
    transition_check(QUEUED, INFLIGHT, "claim")
    if limit <= 0:
        return []
    rows = query_fetchall(Q.claim_pull, {
        "consumer": consumer_pk, "limit": int(limit), "queued": QUEUED, "inflight": INFLIGHT,
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
    }, prepare=True)
    return claimed_jobs(rows)


# --- sweeps and operator actions ------------------------------------------------------------------

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

    q = Q.expire_all if consumer_pk is None else Q.expire_consumer
    params = {"max_retry": settings.BROKER_MAX_RETRY, "limit": int(limit), "consumer": consumer_pk}
    total = 0
    stop_at = time.monotonic() + budget
    transitions_check([(INFLIGHT, QUEUED), (INFLIGHT, DEAD)], "timeout")
    while True:
        row = query_fetchone(q, params)
        _settle_on_commit(row[2] or [])
        moved = int(row[0])
        total += moved
        if moved < limit or time.monotonic() >= stop_at:
            return total




def jobs_requeue_dead(*, consumer_pk: int, job_ids: Iterable[int] | None = None,
                      reason: str = "requeue", batch: int = 5000) -> int:
    """DEAD -> QUEUED with the retry count reset (DLQ requeue, admin action). Works in batches so
    millions of dead jobs never hold one long lock. Returns the number requeued."""
    transition_check(DEAD, QUEUED, "requeue")
    ids = list(job_ids) if job_ids is not None else None
    total = 0
    while True:
        row = query_fetchone(Q.requeue_dead, {"consumer": consumer_pk, "dead": DEAD, "queued": QUEUED,
                                                 "ids": ids, "limit": batch, "reason": reason[:32]})
        moved = int(row[0])
        _settle_on_commit(row[2] or [])  # a FAILED partition resumes (jobs.partitions)
        total += moved
        if moved < batch:
            return total


def jobs_delete_dead(*, consumer_pk: int, job_ids: Iterable[int] | None = None, batch: int = 5000,
                     reason: str = "deleted") -> int:
    """Delete DEAD jobs of a consumer (DLQ purge / delete one, partition skip). Each gets a history
    row (DEAD -> GONE with ``reason``, written by the history trigger). Returns how many were deleted."""
    transition_check(DEAD, GONE, "delete")
    ids = list(job_ids) if job_ids is not None else None
    total = 0
    while True:
        rows = query_fetchall(Q.delete_dead, {"consumer": consumer_pk, "ids": ids, "limit": batch,
                                                 "reason": reason[:32]})
        deleted = len(rows)
        _settle_on_commit(r[0] for r in rows)
        total += deleted
        if deleted < batch:
            return total


PURGED = GONE  # to_status of the history row of a purged (deleted) QUEUED job: it has no status any more



def jobs_purge_queued(*, consumer_pk: int, older_than=None, older_than_seconds: float | None = None,
                      batch: int = 5000, progress=None) -> int:
    """Delete a consumer's QUEUED jobs (a runaway backlog), optionally only those created before
    ``older_than`` (an aware datetime) or more than ``older_than_seconds`` ago (database time). Batches of ``batch`` rows, each its own statement and
    transaction (SKIP LOCKED, so a claim in progress is never waited for), so millions of jobs never
    hold one long lock. Every purged job gets a history row (QUEUED -> 0, reason ``purged``) in the
    same statement. ``progress(batch_count, total)`` is called after each batch. Returns the total."""
    transition_check(QUEUED, GONE, "purge")
    total = 0
    while True:
        row = query_fetchone(Q.purge_queued, {"consumer": consumer_pk, "queued": QUEUED,
                                                 "before": older_than, "age": older_than_seconds,
                                                 "limit": int(batch)})
        deleted = int(row[0])
        _settle_on_commit(row[1] or [])
        total += deleted
        if progress is not None:
            progress(deleted, total)
        if deleted < batch:
            return total




def jobs_mark_dead(*, job_ids: Iterable[int], reason: str = "operator",
                   consumer_pk: int | None = None) -> dict[int, int]:
    """An operator gives up on jobs: QUEUED or INFLIGHT -> DEAD (retry count kept, so a requeue
    starts them over). The one move an operator has that no consumer has: QUEUED -> DEAD. One
    statement; rows are locked in id order (waiting briefly for a claim in progress rather than
    skipping it) and each moves only from the status it had when locked. Returns {job_id:
    from_status} for the jobs that moved; other ids were already DELIVERED/DEAD or unknown. A push
    attempt in progress still records its attempt, but its outcome no longer moves the job."""
    transitions_check([(QUEUED, DEAD), (INFLIGHT, DEAD)], "mark_dead")
    ids = sorted({int(i) for i in job_ids})
    if not ids:
        return {}
    rows = query_fetchall(Q.mark_dead, {"ids": ids, "queued": QUEUED, "inflight": INFLIGHT, "dead": DEAD,
                                           "consumer": consumer_pk, "reason": reason[:32]})
    _settle_on_commit(row[2] for row in rows)
    return {row[0]: row[1] for row in rows}


# --- pull consumers: claim within a byte budget, extend a deadline -------------------------------





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
    transition_check(QUEUED, INFLIGHT, "claim")
    rows = query_fetchall(Q.claim_pull_bytes, params, prepare=True)
    return claimed_jobs(rows)




def jobs_extend(*, consumer_pk: int, job_ids: Sequence[int], incremental_timeout: float | None = None,
                connection_timeout: float | None = None) -> dict[int, tuple]:
    """Work in progress: push the deadline of in-flight jobs to now + stopTimeout + rationalDelay +
    IncrementalTimeout (never earlier than it was). Not a transition: status and retry count stay.
    Returns {job_id: (deadline, retry_count)} for the jobs that are INFLIGHT and the consumer's."""
    if not job_ids:
        return {}
    rows = query_fetchall(Q.extend, {"ids": list(job_ids), "inflight": INFLIGHT, "consumer": consumer_pk,
                                        "timeout": inflight_timeout(0, connection_timeout),
                                        "inc": incremental_timeout}, prepare=True)
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
PUSH_TRANSACTION_SETUP = Q.push_transaction_setup.sql




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
    transition_check(QUEUED, INFLIGHT, "claim")
    if limit <= 0:
        return []
    params = {
        "limit": int(limit),
        "conn_timeout": float(settings.BROKER_CONNECTION_TIMEOUT),
        "rational": float(settings.BROKER_RATIONAL_DELAY),
        "reason": reason[:32],
        "worker": worker or "",
    }
    with transaction.atomic(savepoint=False), transition_errors(), bound_cursor() as cur:
        cur.execute(Q.push_claim_lock.sql, [PUSH_CLAIM_LOCK], prepare=True)
        cur.execute(Q.claim_push.sql, params, prepare=True)
        rows = cur.fetchall()
    return [
        PushJob(id=r[0], consumer_pk=r[1], priority=r[2], retry_count=r[3], message_id=r[4],
                payload=bytes(r[5]), content_type=r[6], consumer_updated_at=r[8],
                partition_key=r[9], gate=r[10] or 0,
                # Django's psycopg setup leaves jsonb undecoded (JSONField decodes it)
                headers=_headers_dict(json.loads(r[7]) if isinstance(r[7], str) else r[7]))
        for r in rows
    ]




def job_move_pull_authenticated_grouped(*, channel_id: str, consumer_id: str, job_id: int | None,
                                        channel_token: str | None, consumer_token: str | None,
                                        from_statuses: Sequence[int], to_status: int,
                                        incremental_timeout: float | None = None, reason: str = "pull",
                                        connection_timeout: float | None = None) -> tuple[tuple | None, bool, str]:
    """The spec path's state change in one round trip (``pull_move_auth``): read the auth row
    (channel, consumer, job) and, in the same statement, move the job if the tokens match, the
    consumer is a pull consumer and the job is in one of ``from_statuses`` (DEAD -> INFLIGHT adds a
    retry); never to INFLIGHT on a consumer with a priority policy (its claims go through the group
    dispatcher, jobs.groups).

    The tokens are compared as md5 digests in SQL (timing reveals nothing usable about the
    secret); the caller still checks the returned tokens in constant time and decides the HTTP
    answer from the row as it was before the move. Returns (auth row with ``jobs.pull._AUTH_SQL``'s
    columns, moved, the consumer's priority policy or ''), or (None, False, '') for an unknown
    channel. The job's partition is settled after commit when it finished."""
    transitions_check((from_status, to_status) for from_status in from_statuses)
    rows = query_fetchall(Q.pull_move_auth, {
        "channel": channel_id, "consumer": consumer_id, "job": job_id,
        "ch_token": channel_token, "c_token": consumer_token,
        "from_s": list(from_statuses), "to_s": to_status, "inc": incremental_timeout,
        "timeout": inflight_timeout(0, connection_timeout), "reason": reason[:32],
    }, prepare=True)
    if not rows:
        return None, False, ""
    row = rows[0]
    moved = bool(row[12])
    if moved and to_status in (DELIVERED, DEAD):
        _settle_on_commit([row[13]])
    return row[:11], moved, row[11] or ""




def jobs_ack_inflight(*, consumer_pk: int, job_ids: Sequence[int], to_statuses: Sequence[int],
                      delays: Sequence[float | None], max_retry: int, reason: str = "ack") -> dict[int, tuple]:
    """A pull consumer's outcomes for many in-flight jobs in one statement (the batch ack):
    INFLIGHT -> DELIVERED / DEAD, or QUEUED (negative acknowledgement: retry + 1, due after the
    delay, DEAD past ``max_retry``; waiting pulls are notified). Guarded by INFLIGHT and the
    consumer. Returns {job_id: (moved, status, retry_count)}: for a job that did not move,
    ``status`` is its current one (None when it is not this consumer's)."""
    transitions_check((INFLIGHT, to_status) for to_status in to_statuses)
    if not job_ids:
        return {}
    rows = query_fetchall(Q.ack, {
        "ids": list(job_ids), "to_s": list(to_statuses), "delay": list(delays), "consumer": consumer_pk,
        "max_retry": int(max_retry), "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT,
        "reason": reason[:32],
    }, prepare=True)
    _settle_on_commit(r[5] for r in rows if r[1] is not None and r[1] != QUEUED)
    return {r[0]: (True, r[1], r[2]) if r[1] is not None else (False, r[3], None) for r in rows}




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


def jobs_push_record(*, outcomes: Sequence[PushOutcome]) -> None:
    """Record finished push attempts in one statement: INFLIGHT -> DELIVERED / QUEUED / DEAD for
    each job still in flight (guarded by the status, so a job the timeout sweep already moved
    is left alone), its transition row, and every attempt's row (attempts are facts, recorded
    even when the job moved meanwhile). One statement instead of a jobs_move plus an INSERT: a
    dispatcher records and claims in every transaction, and round trips are its cost."""
    if not outcomes:
        return
    transitions_check((INFLIGHT, o.to_status) for o in outcomes)
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
    }
    with transition_errors(), bound_cursor() as cur:
        cur.execute(Q.push_record.sql, params, prepare=True)
        _settle_on_commit(row[0] for row in cur.fetchall())


# --- partitions: handler-driven gate moves -------------------------------------------------------



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
    transition_check(INFLIGHT, QUEUED, "gate")
    if not moves:
        return {}
    rows = query_fetchall(Q.gate_move, {
        "ids": [m.job_id for m in moves], "gates": [int(m.gate) for m in moves],
        "payloads": [m.payload for m in moves], "keep": [m.payload is None for m in moves],
        "consumer": consumer_pk,
    })
    _settle_on_commit(r[1] for r in rows)
    return {r[0]: r[1] for r in rows}
