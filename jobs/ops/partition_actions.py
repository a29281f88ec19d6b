"""An operator's actions on a partition (the partition endpoints and the admin): close, update its
flags, advance it past its gate, retry its dead jobs, skip them. Each writes the partition row
optimistically (``partition_write``: a version compare-and-set, retried on a lost race)."""

from __future__ import annotations

from django.db import transaction

from broker.db.run import query_fetchall, query_fetchone
from broker.errors import Conflict
from jobs.ops.dead_jobs import jobs_delete_dead, jobs_requeue_dead
from jobs.ops.queries import Q
from jobs.partitions.rows import (AVAILABLE, OCC_RETRIES, PARTITION_STATUS_NAMES, partition_counts_read, partition_repr,
                                  partition_require)
from jobs.partitions.settle import partition_settle, pull_waiters_wake
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED

_WRITABLE = {"gate", "status", "closed", "auto_close", "manual_checkpoint"}


def partition_write(*, partition_pk: int, version: int, **fields) -> int | None:
    """The optimistic write every change of a partition is: set ``fields`` (gate, status, closed,
    auto_close, manual_checkpoint) if the row is still at ``version``. Returns the new version, or
    None when another writer got there first (re-read and decide again; never overwrite)."""
    unknown = set(fields) - _WRITABLE
    if unknown:
        raise ValueError(f"not writable: {sorted(unknown)}")
    r = query_fetchone(Q.partition_write, {**dict.fromkeys(_WRITABLE), **fields, "id": partition_pk,
                                           "version": version})
    return r[0] if r else None


def _occ(partition_pk, consumer_pk, key, change) -> dict:
    """Run ``change(row) -> {field: value} | None`` (``partition_write``'s fields) with the version
    check, retrying lost races; then settle and answer the partition."""
    for _ in range(OCC_RETRIES):
        with transaction.atomic():
            row = partition_require(partition_pk, consumer_pk, key)
            update = change(row)
            if update is None or partition_write(partition_pk=row.id, version=row.version, **update) is not None:
                break
    else:
        raise Conflict("version_conflict", "the partition changed concurrently too often; try again")
    partition_settle(partition_pk=row.id)
    return partition_repr(partition_require(row.id))


def partition_close(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None) -> dict:
    """The producer says no more items: the partition completes once all its jobs are delivered,
    and later publishes to the key are refused (409 ``partition_closed``)."""
    return _occ(partition_pk, consumer_pk, key, lambda row: None if row.closed else {"closed": True})


def partition_update(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None,
                     auto_close: bool | None = None, manual_checkpoint: bool | None = None) -> dict:
    """Set ``auto_close`` / ``manual_checkpoint`` (None leaves a flag as it is)."""
    def change(row):
        fields = {}
        if auto_close is not None and auto_close != row.auto_close:
            fields["auto_close"] = bool(auto_close)
        if manual_checkpoint is not None and manual_checkpoint != row.manual_checkpoint:
            fields["manual_checkpoint"] = bool(manual_checkpoint)
        return fields or None

    return _occ(partition_pk, consumer_pk, key, change)


def partition_advance(*, consumer_pk: int | None = None, key: str | None = None,
                      partition_pk: int | None = None) -> dict:
    """Manual checkpoint: move an AVAILABLE partition whose current gate is finished (nothing
    QUEUED, INFLIGHT or DEAD there) to the next gate that has jobs. 409 ``gate_not_finished``
    while work remains at the current gate, ``partition_not_available`` when FAILED/COMPLETE,
    ``no_next_gate`` when no higher gate has jobs."""
    def change(row):
        if row.status != AVAILABLE:
            raise Conflict("partition_not_available",
                           f"partition is {PARTITION_STATUS_NAMES[row.status]}; only AVAILABLE partitions advance")
        counts = partition_counts_read(row.id, row.gate)
        if any(counts.get((row.gate, s), 0) for s in (QUEUED, INFLIGHT, DEAD)):
            raise Conflict("gate_not_finished", f"jobs at gate {row.gate} are not all delivered")
        higher = sorted({g for (g, s), n in counts.items() if g > row.gate and s != DELIVERED and n})
        if not higher:
            raise Conflict("no_next_gate", "no higher gate has jobs")
        return {"gate": higher[0]}

    body = _occ(partition_pk, consumer_pk, key, change)
    row = partition_require(partition_pk, consumer_pk, key)
    pull_waiters_wake(consumer_pk=row.consumer_pk)
    return body


def partition_retry(*, consumer_pk: int | None = None, key: str | None = None,
                    partition_pk: int | None = None) -> dict:
    """Requeue the partition's DEAD jobs (retry count reset, like the DLQ requeue); the partition
    is AVAILABLE again (settled after the requeue). Answers the partition plus ``requeued``."""
    row = partition_require(partition_pk, consumer_pk, key)
    ids = [r[0] for r in query_fetchall(Q.partition_dead_jobs, [row.id])]
    requeued = jobs_requeue_dead(consumer_pk=row.consumer_pk, job_ids=ids, reason="partition-retry") if ids else 0
    partition_settle(partition_pk=row.id)
    return {**partition_repr(partition_require(row.id)), "requeued": requeued}


def partition_skip(*, consumer_pk: int | None = None, key: str | None = None,
                   partition_pk: int | None = None) -> dict:
    """Give up on the DEAD jobs at the partition's current gate: they are deleted (as the DLQ's
    delete does; their history rows stay), so the gate counts as finished and the partition moves
    on (AVAILABLE, next gate or COMPLETE). Answers the partition plus ``skipped``."""
    row = partition_require(partition_pk, consumer_pk, key)
    ids = [r[0] for r in query_fetchall(Q.partition_gate_dead_jobs, [row.id, row.gate])]
    skipped = jobs_delete_dead(consumer_pk=row.consumer_pk, job_ids=ids, reason="partition-skip") if ids else 0
    partition_settle(partition_pk=row.id)
    return {**partition_repr(partition_require(row.id)), "skipped": skipped}
