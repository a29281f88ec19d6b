"""The record of finished push attempts: each job still INFLIGHT moves to DELIVERED, QUEUED (retry
after the backoff, at least a 429/503's Retry-After) or DEAD, every attempt's row is written and
the circuit breakers are updated, in one statement per batch (``jobs_push_record``); one log line
per attempt."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

from broker.db.run import array_literal, bound_cursor, transition_errors
from broker.xid import job_xid
from jobs.partitions.gates import GateMove, jobs_move_gate
from jobs.partitions.settle import settle_on_commit
from jobs.push.circuit import CircuitTally, attempt_failed, circuit_changes_advise, circuit_tallies
from jobs.push.queries import Q
from jobs.state.retries import backoff_delay, max_retry_for
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED, transitions_check

# One line per attempt under the dispatcher's logger name, which operators filter on (README:
# "every push attempt writes one JSON line").
logger = logging.getLogger("jobs.push.dispatcher")


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


def jobs_push_record(*, outcomes: Sequence[PushOutcome], circuits: Sequence[CircuitTally] = ()) -> list[tuple]:
    """Record finished push attempts in one statement: INFLIGHT -> DELIVERED / QUEUED / DEAD for
    each job still in flight (guarded by the status, so a job the timeout sweep already moved
    is left alone), its transition row, and every attempt's row (attempts are facts, recorded
    even when the job moved meanwhile). One statement instead of a jobs_move plus an INSERT: a
    dispatcher records and claims in every transaction, and round trips are its cost.

    ``circuits``: the batch's tallies per consumer for the circuit breaker (jobs.push.circuit), applied
    in the same statement. Returns the circuits whose state changed, as (consumer pk, new state)."""
    if not outcomes:
        return []
    columns = {name: [] for name in _COLUMNS}
    for o in outcomes:
        for name, attribute in _COLUMNS.items():
            columns[name].append(getattr(o, attribute))
    return _record(columns, circuits)


# the push record's per-attempt parameters and the PushOutcome fields they hold
_COLUMNS = {"ids": "job_id", "to_s": "to_status", "delay": "delay", "max_retry": "max_retry", "attempts": "attempt",
            "ages": "age", "durations": "duration_ms", "codes": "status_code", "excerpts": "excerpt", "errors": "error",
            "request_ids": "request_id", "outcomes": "outcome"}
_TEXT_COLUMNS = {"excerpts", "errors", "request_ids", "outcomes"}


def _record(columns: dict[str, list], circuits: Sequence[CircuitTally]) -> list[tuple]:
    """``jobs_push_record`` over its parameters as columns (one list per ``_COLUMNS`` name)."""
    transitions_check((INFLIGHT, to_status) for to_status in set(columns["to_s"]))
    params = {name: array_literal(values, text=name in _TEXT_COLUMNS) for name, values in columns.items()}
    params.update({  # array literals, not lists: psycopg would dump each element in Python (broker.db.run)
        "cb_consumers": array_literal([t.consumer_pk for t in circuits]),
        "cb_ok": array_literal([t.ok for t in circuits]),
        "cb_fails": array_literal([t.fails for t in circuits]),
        "cb_since": array_literal([t.since for t in circuits]),
    })
    with transition_errors(), bound_cursor() as cur:
        cur.execute(Q.push_record.sql, params, prepare=True)
        rows = cur.fetchall()
    settle_on_commit(row[0] for row in rows)
    return [(row[1], row[2]) for row in rows if row[1] is not None]


def _clean(text: str) -> str:
    return text.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL


def outcomes_record(items: list[tuple], *, now: float | None = None) -> list[float]:
    """Record finished attempts (``jobs_push_record``: one statement). ``items`` are
    (PushJob, Target, Result). Returns the retry delays (seconds) so the caller can wake up
    when those jobs are due.

    2xx -> DELIVERED; 410 Gone -> DEAD; anything else -> QUEUED with retry + 1 after the
    backoff (at least the Retry-After of a 429/503), or DEAD past the consumer's max retry.
    """
    if not items:
        return []
    now = time.monotonic() if now is None else now
    columns = {name: [] for name in _COLUMNS}
    (ids, to_s, delays, max_retries, attempts, ages, durations, codes, excerpts, errors, request_ids,
     outcomes) = columns.values()
    gate_moves, attempted, retry_delays = [], [], []
    for job, target, result in items:
        outcome = result.outcome
        answer = result.answer
        failed = attempt_failed(outcome=outcome, status_code=result.status_code)  # (the answer's own outcome)
        if answer is not None and answer.move:
            outcome = "gate"  # recorded below as an attempt; the job moves to the gate first
            gate_moves.append(GateMove(job_id=job.id, gate=answer.gate, payload=answer.payload))
        elif answer is not None:  # the handler reported an error (or a bad answer): a failed attempt
            outcome = "dead" if answer.no_retry else "failed"
            result.error = answer.error
        age = max(0.0, now - (result.finished - result.duration))
        ids.append(job.id)
        attempts.append(job.retry_count + 1)
        ages.append(age)
        durations.append(round(result.duration * 1000.0, 3))
        codes.append(result.status_code)
        excerpts.append(_clean(result.excerpt) if result.excerpt else "")
        errors.append(_clean(result.error) if result.error else "")
        request_ids.append(result.request_id)
        outcomes.append(outcome)
        attempted.append((job.consumer_pk, failed, job.circuit_dirty, age))
        if outcome == "delivered":
            to_s.append(DELIVERED)
            delays.append(None)
            max_retries.append(None)
        elif outcome in ("gone", "dead"):
            to_s.append(DEAD)
            delays.append(None)
            max_retries.append(None)
        elif outcome == "gate":
            to_s.append(QUEUED)  # no-op: jobs_move_gate moved it
            delays.append(0.0)
            max_retries.append(None)
        else:
            delay = backoff_delay(job.retry_count + 1, target.backoff)
            if result.retry_after is not None:
                delay = max(delay, result.retry_after)
            to_s.append(QUEUED)
            delays.append(delay)
            max_retries.append(max_retry_for(target.max_retry))
            retry_delays.append(delay)
    jobs_move_gate(moves=gate_moves)  # before the record, which then leaves them alone
    circuit_changes_advise(changes=_record(columns, circuit_tallies(attempted)))
    attempts_log(items)
    return retry_delays


def attempts_log(items: list[tuple]) -> None:
    """One structured line per attempt, with the job, message, channel and consumer ids as fields
    (top-level keys of the JSON log): failures at WARNING, successes at DEBUG (at thousands of
    deliveries a second an INFO line each would cost more CPU than the delivery)."""
    debug = logger.isEnabledFor(logging.DEBUG)
    for job, target, result in items:
        outcome = result.outcome
        if outcome == "delivered" and not debug:
            continue
        logger.log(logging.DEBUG if outcome == "delivered" else logging.WARNING,
                   "push attempt %s: job %s, consumer %s", outcome, job_xid(job.id), target.consumer_id, extra={
                       "job_id": job_xid(job.id), "message_id": job.message_id, "consumer_id": target.consumer_id,
                       "channel_id": target.channel_id, "attempt": job.retry_count + 1, "outcome": outcome,
                       "status_code": result.status_code, "duration_ms": round(result.duration * 1000.0, 3),
                       "error": result.error[:200], "request_id": result.request_id})
