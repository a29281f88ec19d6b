"""Orphaned push claims (issue 38 item 10): the jobs a push dispatcher held INFLIGHT when its
process went (a cluster stopped with SIGTERM to its whole group and SIGKILL after the grace, an OOM
kill, a lost host) go back to QUEUED at the next housekeeping run of any live dispatcher (every
second), instead of holding their consumer's maxInFlight room until their deadline (the connection
timeout plus the rational delay: half a minute by default). A process's claims name its engine
(jobs.push.owners); the engine's LISTEN connection is its sign of life."""

from __future__ import annotations

from broker.db.run import query_fetchone
from jobs.state import floors
from jobs.state.transitions import INFLIGHT, QUEUED, transition_check
from jobs.sweeps.queries import Q

_legacy = {"done": False}  # this process found the ownerless push claims with nobody left to hold them


def jobs_requeue_orphans() -> int:
    """Requeue the push claims of dispatchers that are gone and, until that has been done once
    with no dispatcher of an older release connected, the push claims without an owner (made by
    that release: a rolling upgrade's old cluster). Returns how many jobs moved."""
    transition_check(INFLIGHT, QUEUED, "orphaned")
    # prepared: it runs every second in every dispatcher process, and planning it (0.9-1.2 ms) cost
    # three times its run (0.3-0.4 ms) on an idle broker; its one parameter only gates its walks
    # (one-time filters), so the generic plan is the custom one
    moved, waiting, consumers = query_fetchone(Q.orphans_requeue, {"legacy": not _legacy["done"]}, prepare=True)
    if not _legacy["done"] and waiting == 0:
        _legacy["done"] = True
    for consumer in set(consumers):  # back to QUEUED below this process's claim floors
        floors.consumer_reset(consumer)
    return int(moved)
