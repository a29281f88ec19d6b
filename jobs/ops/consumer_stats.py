"""A consumer's figures for its GET (and the admin): jobs by status from the maintained counters
(never a count over jobs), the pulls waiting now, and its footprint (retention)."""

from __future__ import annotations

from broker.counters import JOB, REDELIVERED, counts_for
from broker.db.run import query_fetchone
from jobs.ops.queries import Q
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.sweeps.inflight_timeout import consumer_sweep
from jobs.sweeps.retention import consumer_footprint


def consumer_stats(*, consumer_pk: int, sweep: bool = False) -> dict:
    """Maintained counters (never COUNT(*) over jobs) plus the live waiter rows. ``sweep`` (pull
    consumers) first requeues expired leases, at most once a second per process, so the numbers
    do not show a lease that has run out."""
    if sweep:
        consumer_sweep(consumer_pk=consumer_pk)
    counts = counts_for(scope=JOB, owner_ids=[consumer_pk]).get(consumer_pk, {})
    waiting = int(query_fetchone(Q.pull_waiting, [consumer_pk])[0])
    return {
        "NumPending": counts.get(QUEUED, 0),
        "NumAckPending": counts.get(INFLIGHT, 0),
        "NumRedelivered": counts.get(REDELIVERED, 0),
        "NumWaiting": waiting,
        "NumDead": counts.get(DEAD, 0),
        "NumDelivered": counts.get(DELIVERED, 0),
        # retention: the oldest stored job's message, what retention removed, its last run
        "Footprint": consumer_footprint(consumer_pk=consumer_pk),
    }
