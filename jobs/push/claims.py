"""The push dispatcher's two statements: the claim across every push consumer (``claim_push``,
after ``push_claim_lock``) and the record of finished attempts (``push_record``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from django.conf import settings
from django.db import transaction

from broker.db.run import bound_cursor, transition_errors
from jobs.claims import headers_decode
from jobs.locks import PUSH_CLAIM_LOCK
from jobs.queries import Q
from jobs.settling import settle_on_commit
from jobs.transitions import INFLIGHT, QUEUED, transition_check, transitions_check




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
    message_type: str | None = None  # filters: sent as X-Broker-Message-Type
    circuit_dirty: bool = False  # its consumer's circuit was counting failures or open when claimed


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
                partition_key=r[9], gate=r[10] or 0, message_type=r[11], circuit_dirty=r[12],
                headers=headers_decode(r[7]))
        for r in rows
    ]


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

    ``circuits``: the batch's tallies per consumer for the circuit breaker (jobs.circuit), applied
    in the same statement. Returns the circuits whose state changed, as (consumer pk, new state)."""
    if not outcomes:
        return []
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
        "cb_consumers": [t.consumer_pk for t in circuits],
        "cb_ok": [t.ok for t in circuits],
        "cb_fails": [t.fails for t in circuits],
    }
    with transition_errors(), bound_cursor() as cur:
        cur.execute(Q.push_record.sql, params, prepare=True)
        rows = cur.fetchall()
    settle_on_commit(row[0] for row in rows)
    return [(row[1], row[2]) for row in rows if row[1] is not None]
