"""Operator and DLQ actions on jobs: requeue dead jobs, delete them, purge a queued backlog, give up
on jobs (mark dead). Batched, SKIP LOCKED where a batch may wait on nothing. The DLQ endpoints, the
pull spec's requeue and delete of one dead job, the admin actions and the management commands all
call these."""

from __future__ import annotations

from typing import Iterable

from django.db.models import OuterRef, QuerySet, Subquery

from broker.db.run import query_fetchall, query_fetchone
from jobs.models import DeliveryAttempt, Job, JobTransition
from jobs.ops.queries import Q
from jobs.partitions.settle import settle_on_commit
from jobs.state import floors
from jobs.state.transitions import DEAD, GONE, INFLIGHT, QUEUED, transition_check, transitions_check


def dead_jobs_listed(*, consumer_pk: int, last_attempt: bool = False) -> QuerySet:
    """A consumer's DEAD jobs, newest first (``job_consumer_status``), each with ``dead_reason``:
    why it died (the reason of its last move to DEAD: push, ack, timeout, operator, expired, ...);
    with ``last_attempt`` also its last attempt's ``last_status``, ``last_error`` and
    ``last_excerpt`` (None for pull consumers, which report outcomes without attempts). Each is
    one probe of a ``job_id`` index per row of the page read (the DLQ endpoint, the delivery portal)."""
    dead = Job.objects.filter(consumer_id=consumer_pk, status=DEAD).order_by("-id").annotate(
        dead_reason=Subquery(JobTransition.objects.filter(job_id=OuterRef("pk"), to_status=DEAD)
                             .order_by("-id").values("reason")[:1]))
    if not last_attempt:
        return dead
    last = DeliveryAttempt.objects.filter(job_id=OuterRef("pk")).order_by("-id")
    return dead.annotate(last_status=Subquery(last.values("status_code")[:1]),
                         last_error=Subquery(last.values("error")[:1]),
                         last_excerpt=Subquery(last.values("response_excerpt")[:1]))


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
            if total:
                floors.consumer_reset(consumer_pk)  # requeued below this process's floors
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
