"""A test helper: the generic batched move (``move`` in ``tests/jobs/move.sql``), any transitions
of the table, each guarded by its expected status. The engine's paths have their own statements
(claims, acks, push records, sweeps, operator actions); tests use this one to put jobs in a state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from broker.db.queries import queries_load
from broker.db.run import query_fetchall
from jobs.partitions.settle import settle_on_commit
from jobs.state.transitions import DEAD, INFLIGHT, QUEUED, transitions_check

MOVE = queries_load(Path(__file__).with_name("move.sql"))["move"]


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
    columns = {"ids": "job_id", "from_s": "from_status", "to_s": "to_status", "retry_inc": "retry_inc",
               "delay": "delay", "timeout": "timeout", "inc": "incremental_timeout", "max_retry": "max_retry",
               "reset": "retry_reset"}  # the statement's array parameters: one per Move field
    params = {
        **{name: [getattr(m, field) for m in moves] for name, field in columns.items()},
        "consumer": consumer_pk,
        "reason": reason[:32],
        "queued": QUEUED,
        "dead": DEAD,
        "inflight": INFLIGHT,
    }
    rows = query_fetchall(MOVE, params)
    settle_on_commit(row[4] for row in rows if row[1] != INFLIGHT)
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def job_move(*, job_id: int, from_status: int, to_status: int, reason: str,
             consumer_pk: int | None = None, **fields) -> tuple | None:
    """One transition; returns (status, retry_count, deadline) or None if the job was not in
    ``from_status``."""
    result = jobs_move(moves=[Move(job_id=job_id, from_status=from_status, to_status=to_status, **fields)],
                       reason=reason, consumer_pk=consumer_pk)
    return result.get(job_id)
