"""The timeout sweep: in-flight jobs past their deadline back to QUEUED (retry + 1), or DEAD past
the consumer's retry limit (``expire_inflight``). The workers sweep every consumer
every second (a housekeeping step); the pull routes also sweep their own consumer at most once a
second per process (``consumer_sweep``), so a pull consumer's timeouts hold even when no worker runs."""

from __future__ import annotations

import threading
import time

from django.conf import settings

from broker.db.run import query_fetchone
from jobs.partitions.settle import settle_on_commit
from jobs.state import floors
from jobs.state.transitions import DEAD, INFLIGHT, QUEUED, transitions_check
from jobs.sweeps.queries import Q

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

    began = time.monotonic()
    since, full = floors.DEADLINES.time(consumer_pk, began)  # jobs.state.floors: where the walk starts
    params = {"max_retry": settings.BROKER_MAX_RETRY, "limit": int(limit), "consumer": consumer_pk,
              "since": since, "lag": floors.LAG}
    total = 0
    stop_at = began + budget
    transitions_check([(INFLIGHT, QUEUED), (INFLIGHT, DEAD)], "timeout")
    while True:
        row = query_fetchone(Q.expire_inflight, params)
        settle_on_commit(row[2] or [])
        moved = int(row[0])
        total += moved
        if moved < limit:  # every expired job past the floor moved: the next sweep may start at this one's
            floors.DEADLINES.walked(consumer_pk, began=began, full=full, value=row[3])
            return total
        if time.monotonic() >= stop_at:
            return total


SWEEP_INTERVAL = 1.0  # seconds between lazy per-consumer timeout sweeps in one process
_last_sweep: dict[int, float] = {}
_sweep_lock = threading.Lock()


def consumer_sweep(*, consumer_pk: int, force: bool = False) -> int:
    """Requeue (or kill) this consumer's in-flight jobs whose deadline passed. The workers sweep
    every consumer periodically; the pull endpoints also sweep their own consumer at most once a
    second per process, so a pull consumer's timeouts hold within about a second even when no
    worker runs. Cheap when nothing expired (partial index on in-flight deadlines)."""
    now = time.monotonic()
    with _sweep_lock:
        if not force and now - _last_sweep.get(consumer_pk, -1e9) < SWEEP_INTERVAL:
            return 0
        _last_sweep[consumer_pk] = now
    return jobs_expire_inflight(consumer_pk=consumer_pk, budget=0)  # one batch: a request waits on it
