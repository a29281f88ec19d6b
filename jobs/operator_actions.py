"""Operator and DLQ actions on jobs: requeue dead jobs, delete them, purge a queued backlog, give up
on jobs (mark dead). Batched, SKIP LOCKED where a batch may wait on nothing."""

from __future__ import annotations

from typing import Iterable

from broker.db.run import query_fetchall, query_fetchone
from jobs import partitions
from jobs.queries import Q
from jobs.settling import settle_on_commit
from jobs.transitions import DEAD, GONE, INFLIGHT, QUEUED, transition_check, transitions_check


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
        settle_on_commit(row[2] or [])  # a FAILED partition resumes (jobs.partitions)
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
        settle_on_commit(r[0] for r in rows)
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
        settle_on_commit(row[1] or [])
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
    settle_on_commit(row[2] for row in rows)
    return {row[0]: row[1] for row in rows}


# --- partition operator actions (jobs.partitions holds the partition rules) ---------------------

def partition_retry(*, consumer_pk: int | None = None, key: str | None = None,
                    partition_pk: int | None = None) -> dict:
    """Requeue the partition's DEAD jobs (retry count reset, like the DLQ requeue); the partition
    is AVAILABLE again (settled after the requeue). Answers the partition plus ``requeued``."""
    row = partitions.partition_require(partition_pk, consumer_pk, key)
    ids = [r[0] for r in query_fetchall(Q.partition_dead_jobs, [row.id])]
    requeued = jobs_requeue_dead(consumer_pk=row.consumer_pk, job_ids=ids, reason="partition-retry") if ids else 0
    partitions.partition_settle(partition_pk=row.id)
    return {**partitions.partition_repr(partitions.partition_require(row.id)), "requeued": requeued}


def partition_skip(*, consumer_pk: int | None = None, key: str | None = None,
                   partition_pk: int | None = None) -> dict:
    """Give up on the DEAD jobs at the partition's current gate: they are deleted (as the DLQ's
    delete does; their history rows stay), so the gate counts as finished and the partition moves
    on (AVAILABLE, next gate or COMPLETE). Answers the partition plus ``skipped``."""
    row = partitions.partition_require(partition_pk, consumer_pk, key)
    ids = [r[0] for r in query_fetchall(Q.partition_gate_dead_jobs, [row.id, row.gate])]
    skipped = jobs_delete_dead(consumer_pk=row.consumer_pk, job_ids=ids, reason="partition-skip") if ids else 0
    partitions.partition_settle(partition_pk=row.id)
    return {**partitions.partition_repr(partitions.partition_require(row.id)), "skipped": skipped}
