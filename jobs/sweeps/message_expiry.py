"""Expiry: QUEUED jobs whose message expired become DEAD with reason ``expired``.

Claims never hand out an expired job (each claim tests ``jobs_job.expires_at``, copied from the
message at fan-out); this sweep then moves those jobs to the dead letters, within a second of expiry
wherever a push dispatcher loop runs (it sweeps every second) and at the latest at the fallback
maintenance task. A job in flight when its message expires finishes its attempt; should it come
back to QUEUED, the next sweep kills it. The move QUEUED -> DEAD is in the transition table (kind
``expired``); its history row is written by the jobs_job trigger from ``last_reason = 'expired'``."""

from __future__ import annotations

import time

from broker.db.run import query_fetchone
from jobs.partitions.settle import settle_on_commit
from jobs.state import floors
from jobs.state.transitions import DEAD, QUEUED, transition_check
from jobs.sweeps.queries import Q

EXPIRED_REASON = "expired"  # the transition kind and the history reason (set in expire_messages)
EXPIRY_BATCH = 5000
EXPIRY_BUDGET = 2.0  # seconds one sweep call may spend on batches (the dispatcher sweeps every second)


def jobs_expire_messages(*, limit: int = EXPIRY_BATCH, budget: float = EXPIRY_BUDGET) -> int:
    """Move QUEUED jobs whose message expired to DEAD (history reason ``expired``), in batches of
    ``limit`` (each its own statement and, outside a transaction, its own commit) until a batch comes
    back short or ``budget`` seconds are spent. Partitions of the dead jobs are settled after commit
    (a dead job at the current gate fails its partition, as any dead job does). Returns how many."""
    transition_check(QUEUED, DEAD, EXPIRED_REASON)
    total = 0
    began = time.monotonic()
    since, full = floors.EXPIRIES.time(None, began)  # jobs.state.floors: where this sweep's walk starts
    stop_at = began + budget
    while True:
        moved, partitions, floor = query_fetchone(Q.expire_messages, {"limit": int(limit), "since": since,
                                                                      "lag": floors.LAG})
        settle_on_commit(partitions or [])
        total += int(moved)
        if moved < limit:  # every expired job past the floor moved: the next sweep may start at this one's
            floors.EXPIRIES.walked(None, began=began, full=full, value=floor)
            return total
        if time.monotonic() >= stop_at:
            return total


def job_expired_status(*, job_pk: int) -> int | None:
    """The job's status when its message has expired, else None. Asked only after a move was
    refused, to answer 409 ``message_expired`` (a requeue of a DEAD job, a claim of a QUEUED one)
    instead of a generic 400."""
    row = query_fetchone(Q.expired_status, {"job": job_pk})
    return None if row is None else row[0]
