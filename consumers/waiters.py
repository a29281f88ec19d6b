"""Pull waiters as a whole (the rows are written by ``jobs.pull.claim``): what ``/metrics`` reports."""

from __future__ import annotations

from broker.db.run import query_fetchall
from consumers.queries import Q


def pull_waiters_count() -> dict[int, int]:
    """Live waiting pulls per consumer pk (rows of every web process; a dead waiter's row expires)."""
    return {consumer: int(n) for consumer, n in query_fetchall(Q.pull_waiters_live)}
