"""Settling a partition: after its jobs moved, advance it to the next gate that has jobs once every
job at the current one is DELIVERED (COMPLETE past the last with ``autoClose`` or once closed),
mark it FAILED while a job there is DEAD, wake waiting pulls and record advisories. Every status
writer calls ``settle_on_commit`` with the partitions of the jobs it moved; ``partitions_settle_stale``
(a housekeeping step) repairs a settle that was lost (a crash between commit and settle)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import transaction

from broker.db.run import query_execute, query_fetchall, query_fetchone
from jobs.advisories.record import advisory_record
from jobs.partitions.queries import Q
from jobs.partitions.rows import (AVAILABLE, COMPLETE, FAILED, OCC_RETRIES, Row, counts_repr, partition_counts_read,
                                  partition_row_read)
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED

logger = logging.getLogger(__name__)


@dataclass
class Settled:
    partition_pk: int
    gate: int
    status: int
    version: int
    changed: bool
    attempts: int


def _next_state(row: Row, counts: dict) -> tuple[int, int]:
    """The partition's (gate, status) implied by its jobs. FAILED while a job at the current gate
    is DEAD; else AVAILABLE, advanced past finished gates (unless manual checkpoint); COMPLETE when
    nothing is left and the partition is closed or auto-closing."""
    gate, status = row.gate, row.status
    if status == COMPLETE:
        return gate, status
    while True:
        if counts.get((gate, DEAD), 0):
            return gate, FAILED
        status = AVAILABLE
        if counts.get((gate, QUEUED), 0) or counts.get((gate, INFLIGHT), 0):
            return gate, status
        higher = sorted({g for (g, s), n in counts.items() if g > gate and s != DELIVERED and n})
        if higher:
            if row.manual_checkpoint:
                return gate, status
            gate = higher[0]
            continue
        if row.closed or row.auto_close:
            return gate, COMPLETE
        return gate, status


def pull_waiters_wake(*, consumer_pk: int) -> None:
    """Wake waiting pulls and push dispatchers (delivered on commit, like publish's NOTIFY)."""
    query_execute(Q.jobs_notify, [str(consumer_pk)])


def _advise(row: Row, type_: str, gate: int) -> None:
    counts = counts_repr(partition_counts_read(row.id))
    advisory_record(type=type_, channel=row.channel_id, consumer=row.consumer_id, consumer_pk=row.consumer_pk,
                    data={"key": row.key, "gate": gate, "counts": counts["total"], "gates": counts["gates"]})


def partition_settle(*, partition_pk: int) -> Settled | None:
    """Recompute one partition from its jobs' per-gate counts and write the result with the
    version check (re-read and retry on a lost race). Records ``partition_failed`` /
    ``partition_complete`` advisories and wakes the consumer's waiters when jobs became
    claimable. None for an unknown partition."""
    for attempt in range(1, OCC_RETRIES + 1):
        with transaction.atomic():
            row = partition_row_read(partition_pk=partition_pk)
            if row is None:
                return None
            if row.status == COMPLETE:
                return Settled(row.id, row.gate, row.status, row.version, False, attempt)
            if row.status == AVAILABLE:
                dead, busy = query_fetchone(Q.partition_gate_busy, [row.id, row.gate, row.id, row.gate])
                if busy and not dead:  # what _next_state would answer: unchanged
                    return Settled(row.id, row.gate, row.status, row.version, False, attempt)
            counts = partition_counts_read(row.id, row.gate)
            gate, status = _next_state(row, counts)
            if (gate, status) == (row.gate, row.status):
                return Settled(row.id, gate, status, row.version, False, attempt)
            written = query_fetchone(Q.partition_settle_write,
                                     [gate, status, status, status, status, row.id, row.version])
            if written is None:
                continue  # someone wrote first: re-read, never overwrite
            if status == FAILED:
                _advise(row, "partition_failed", gate)
            elif status == COMPLETE:
                _advise(row, "partition_complete", gate)
            if status == AVAILABLE:
                pull_waiters_wake(consumer_pk=row.consumer_pk)
            return Settled(row.id, gate, status, written[0], True, attempt)
    logger.warning("partition %s: settle lost %d races in a row; the next move settles it", partition_pk,
                   OCC_RETRIES)
    return None


def partitions_settle(*, partition_ids) -> list[Settled]:
    """Settle each partition (called after commit of the job moves: settle_on_commit)."""
    out = []
    for pk in sorted(set(partition_ids)):
        try:
            result = partition_settle(partition_pk=pk)
        except Exception:  # noqa: BLE001 - the sweep (partitions_settle_stale) settles it later
            logger.exception("partition %s: settle failed", pk)
            continue
        if result is not None:
            out.append(result)
    return out


STALE_EVERY = 10.0  # seconds between safety-net settles in one process
_stale_next = 0.0


def partitions_settle_stale(*, limit: int = 100, force: bool = False) -> int:
    """Safety net (run with the dispatcher's timeout sweep, at most every ``STALE_EVERY`` seconds
    per process): settle partitions a settle would change, in case a settle after commit was lost
    (its process died between the commit and the settle). Returns how many changed."""
    global _stale_next
    if not force and time.monotonic() < _stale_next:
        return 0
    _stale_next = time.monotonic() + STALE_EVERY
    ids = [r[0] for r in query_fetchall(Q.partitions_stale, [limit])]
    return sum(1 for s in partitions_settle(partition_ids=ids) if s.changed)


def settle_on_commit(partition_ids) -> None:
    """Settle the partitions of jobs that just finished (DELIVERED / DEAD / moved), after the
    transaction commits: a settle must see every committed move, and the last committer of a
    partition's moves then always sees all of them (partitions_settle)."""
    ids = sorted({int(i) for i in partition_ids if i is not None})
    if not ids:
        return

    def settle() -> None:
        partitions_settle(partition_ids=ids)

    transaction.on_commit(settle, robust=True)
