"""Deleting archived messages from PostgreSQL: the only place the pipeline writes to the database.

Deleting is not a job status change (the rows leave the database with their whole history), so
it does not go through the job status writers; it is kept here, in small batches, one transaction each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from django.db import connection, transaction

from jobs.models import JobStatus
from jobs.sweeps.retention import Removed
from pipeline.queries import Q

ADVISORY_KEY = "broker_pipeline_archive"
DELIVERED, DEAD = JobStatus.DELIVERED.value, JobStatus.DEAD.value


@dataclass
class PruneCounts(Removed):
    """The rows removed (as retention counts them), and what the archive's prune saw besides."""

    already_gone: int = 0  # deleted by an earlier (interrupted) run
    changed: list[int] = field(default_factory=list)  # changed since export: kept in PostgreSQL

    def as_dict(self) -> dict:
        return {"messages": self.messages, "jobs": self.jobs, "transitions": self.transitions,
                "attempts": self.attempts, "already_gone": self.already_gone, "changed": len(self.changed)}


def messages_prune(*, expected: Sequence[tuple[int, int, int, int, int]]) -> PruneCounts:
    """Delete one batch of archived messages (id, jobs, transitions, attempts, finished jobs as
    archived) with their jobs, history and attempts, in one transaction, on the primary.

    The message and job rows are locked first (no state move can run until commit), then a
    message is deleted only if PostgreSQL still holds exactly the numbers of rows the verified
    archive holds and every job of it is DELIVERED or DEAD, in the archive and now: the history
    is append-only and every status move appends to it, so equal counts mean nothing changed
    since the history was exported; the jobs' own rows were read a moment earlier (each table is
    read apart, from the primary or a replica), and a job that was requeued in between would be
    archived unfinished. A message that changed stays (and is reported).
    """
    ids = sorted(int(row[0]) for row in expected)
    if not ids:
        return PruneCounts()
    want = {int(i): (int(nj), int(nt), int(na), int(nf)) for i, nj, nt, na, nf in expected}
    result = PruneCounts()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(Q.prune_messages_lock.sql, {"ids": ids})
        present = [row[0] for row in cur.fetchall()]
        result.already_gone = len(ids) - len(present)
        if not present:
            return result
        cur.execute(Q.prune_jobs_lock.sql, {"ids": present})
        cur.execute(Q.prune_counts.sql, {"ids": present, "delivered": DELIVERED, "dead": DEAD})
        keep = []
        for message_id, nj, nt, na, nf in cur.fetchall():
            if want[message_id] == (nj, nt, na, nj) and nf == nj:
                keep.append(message_id)
            else:
                result.changed.append(message_id)
        if keep:
            cur.execute(Q.prune_delete.sql, {"ids": keep})
            result.messages, result.jobs, result.transitions, result.attempts = cur.fetchone()
    return result


def archive_lock_acquire() -> bool:
    """One archive-and-prune at a time per database (session advisory lock)."""
    with connection.cursor() as cur:
        cur.execute(Q.archive_lock_acquire.sql, {"key": ADVISORY_KEY})
        return bool(cur.fetchone()[0])


def archive_lock_release() -> None:
    with connection.cursor() as cur:
        cur.execute(Q.archive_lock_release.sql, {"key": ADVISORY_KEY})


def database_now():
    """Time comes from the database, as everywhere in the broker."""
    with connection.cursor() as cur:
        cur.execute(Q.database_now.sql)
        return cur.fetchone()[0]
