"""Expiry (issue 17 part 3): QUEUED jobs whose message expired become DEAD with reason ``expired``.

Claims never hand out an expired job (each claim tests ``jobs_job.expires_at``, copied from the
message at fan-out); this sweep then moves those jobs to the dead letters, within a second of expiry
wherever a push dispatcher loop runs (it sweeps every second) and at the latest at the fallback
maintenance task. A job in flight when its message expires finishes its attempt; should it come
back to QUEUED, the next sweep kills it. The move QUEUED -> DEAD is in the transition table
(``jobs.state.ALLOWED``) and writes its history row in the same statement, like every other move.
"""

from __future__ import annotations

import time

from django.db import connection

from jobs import state
from jobs.state import DEAD, QUEUED

EXPIRED_REASON = "expired"
EXPIRY_BATCH = 5000
EXPIRY_BUDGET = 2.0  # seconds one sweep call may spend on batches (the dispatcher sweeps every second)

# index: job_queued_expiry (partial: QUEUED rows with an expiry, by expires_at), so a sweep that finds
# nothing costs one index probe however large the backlog. Rows locked SKIP LOCKED (a claim in
# progress is left alone: it cannot pick an expired row anyway) and moved by primary key (``+ 0``
# keeps the status check on the row, as in jobs.state._EXPIRE_SQL).
_EXPIRE_MESSAGES_SQL = f"""
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = {QUEUED} AND j.expires_at IS NOT NULL AND j.expires_at <= now()
     ORDER BY j.expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = {DEAD}, status_changed_at = now(), deadline = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status + 0 = {QUEUED}
    RETURNING j.id, j.retry_count, j.partition_id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, {QUEUED}, {DEAD}, retry_count, '{EXPIRED_REASON}', now() FROM u
)
SELECT count(*), (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL) FROM u
"""


def jobs_expire_messages(*, limit: int = EXPIRY_BATCH, budget: float = EXPIRY_BUDGET) -> int:
    """Move QUEUED jobs whose message expired to DEAD (history reason ``expired``), in batches of
    ``limit`` (each its own statement and, outside a transaction, its own commit) until a batch comes
    back short or ``budget`` seconds are spent. Partitions of the dead jobs are settled after commit
    (a dead job at the current gate fails its partition, as any dead job does). Returns how many."""
    if (QUEUED, DEAD) not in state.ALLOWED:
        raise state.IllegalTransition(f"{QUEUED} -> {DEAD}")
    total = 0
    stop_at = time.monotonic() + budget
    while True:
        with connection.cursor() as cur:
            cur.execute(_EXPIRE_MESSAGES_SQL, {"limit": int(limit)})
            moved, partitions = cur.fetchone()
        state._settle_on_commit(partitions or [])  # noqa: SLF001 - the one settle hook of every move
        total += int(moved)
        if moved < limit or time.monotonic() >= stop_at:
            return total


# index: jobs_job_pkey (by primary key; no status condition, so no status index competes).
# The status of this job if its message has expired (no row: not expired, or no such job).
_EXPIRED_STATUS_SQL = "SELECT status FROM jobs_job WHERE id = %s AND expires_at <= now()"


def job_expired_status(*, job_pk: int) -> int | None:
    """The job's status when its message has expired, else None. Asked only after a move was
    refused, to answer 409 ``message_expired`` (a requeue of a DEAD job, a claim of a QUEUED one)
    instead of a generic 400."""
    with connection.cursor() as cur:
        cur.execute(_EXPIRED_STATUS_SQL, [job_pk])
        row = cur.fetchone()
    return None if row is None else row[0]
