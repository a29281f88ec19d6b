"""After a job move commits, its partition is settled (jobs.partitions): the hook every status
writer calls with the partition ids of the jobs it moved."""

from __future__ import annotations

from django.db import transaction

from jobs.partitions import partitions_settle


def settle_on_commit(partition_ids) -> None:
    """Settle the partitions of jobs that just finished (DELIVERED / DEAD / moved), after the
    transaction commits: a settle must see every committed move, and the last committer of a
    partition's moves then always sees all of them (jobs.partitions.partitions_settle)."""
    ids = sorted({int(i) for i in partition_ids if i is not None})
    if not ids:
        return

    def settle() -> None:
        partitions_settle(partition_ids=ids)

    transaction.on_commit(settle, robust=True)
