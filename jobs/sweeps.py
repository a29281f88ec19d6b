"""The timeout sweep: in-flight jobs past their deadline back to QUEUED (retry + 1), or DEAD past
the consumer's retry limit (``expire_all`` / ``expire_consumer`` in jobs/queries.sql)."""

from __future__ import annotations

import time

from django.conf import settings

from broker.db.run import query_fetchone
from jobs.queries import Q
from jobs.settling import settle_on_commit
from jobs.transitions import DEAD, INFLIGHT, QUEUED, transitions_check


EXPIRE_BATCH = 5000


EXPIRE_BUDGET = 2.0  # seconds one sweep call may spend on batches (the dispatcher sweeps every second)


def jobs_expire_inflight(*, limit: int = EXPIRE_BATCH, consumer_pk: int | None = None,
                         budget: float = EXPIRE_BUDGET) -> int:
    """Move INFLIGHT jobs whose deadline passed back to QUEUED (retry + 1), or DEAD past the
    retry limit. Served by the partial indexes on in-flight deadlines: cheap when nothing is
    stale. ``consumer_pk`` limits it to one consumer (pull endpoints sweep their own consumer
    lazily, so pull timeouts hold even between the workers' sweeps).

    Batches of ``limit`` jobs, each its own statement (and, outside a transaction, its own commit:
    rows are locked SKIP LOCKED and only for one batch, so pulls and acks never wait), until a
    batch comes back short or ``budget`` seconds are spent: 100,000 expired jobs are requeued by
    one call instead of one batch a second. Returns how many jobs moved."""

    q = Q.expire_all if consumer_pk is None else Q.expire_consumer
    params = {"max_retry": settings.BROKER_MAX_RETRY, "limit": int(limit), "consumer": consumer_pk}
    total = 0
    stop_at = time.monotonic() + budget
    transitions_check([(INFLIGHT, QUEUED), (INFLIGHT, DEAD)], "timeout")
    while True:
        row = query_fetchone(q, params)
        settle_on_commit(row[2] or [])
        moved = int(row[0])
        total += moved
        if moved < limit or time.monotonic() >= stop_at:
            return total
