"""Read and compact the maintained counters (see ``broker.models.Counter``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from django.db import connection, transaction
from django.db.models.expressions import RawSQL

from broker.queries import Q

JOB = 1
MESSAGE = 2
REDELIVERED = 2001  # pseudo status: QUEUED/INFLIGHT jobs with retry_count > 0
# (3: scheduled messages, jobs.publish.scheduled; 4: delivery metrics, broker.delivery_metrics)
# Retention (jobs.sweeps.retention): rows removed, per channel (status = RETENTION_TABLES code) and
# per consumer (its jobs, their history and attempts), and the sweep's runs (owner 0: count, duration
# histogram). Numbered after the issue that added them, clear of the small scopes above.
RETENTION = 24
RETENTION_CONSUMER = 25
RETENTION_RUNS = 26
RETENTION_TABLES = {1: "messages", 2: "jobs", 3: "transitions", 4: "attempts"}
# Retention's ledger for the Spark reports (issue 30): jobs removed per channel (owner) and UTC day of
# their message's publication (status: days since 2000-01-01), so a report can tell a day that lost
# rows no archive holds from a complete one.
RETENTION_DAYS = 30

# (owner table of the annotated queryset, with a status?) -> the named scalar subquery, its
# parameters for (scope, status)
_COLUMNS = {
    ("consumer", True): (Q.counter_column_consumer_status, lambda scope, status: (scope, status) * 2),
    ("channel", False): (Q.counter_column_channel, lambda scope, status: (scope, status, status) * 2),
    ("channel", True): (Q.counter_column_channel, lambda scope, status: (scope, status, status) * 2),
}


def counts_for(*, scope: int, owner_ids: Iterable[int] | None = None) -> dict[int, dict[int, int]]:
    """{owner_id: {status: count}} summing the folded counts and the pending deltas."""
    ids = list(owner_ids) if owner_ids is not None else None
    with connection.cursor() as cur:
        cur.execute(Q.counter_counts.sql, {"scope": scope, "ids": ids})
        result: dict[int, dict[int, int]] = defaultdict(dict)
        for owner, status, n in cur.fetchall():
            result[owner][status] = int(n)
    return result


def counters_compact() -> int:
    """Fold pending deltas into the counter rows: the slot not being written, emptied by TRUNCATE
    (``counters_fold_slot``), or, when it cannot be locked at once, every delta by DELETE. One
    compactor at a time (advisory lock), so two never deadlock on counter rows. Returns the
    number of delta rows folded."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(Q.counters_compact_lock.sql)
        if not cur.fetchone()[0]:
            return 0
        cur.execute(Q.counters_fold_slot.sql)
        folded = int(cur.fetchone()[0])
        if folded >= 0:
            return folded
        cur.execute(Q.counters_compact.sql)
        return int(cur.fetchone()[0])


def counters_forget(*, scope: int, owner_id: int) -> None:
    """Drop the counters of a deleted owner (consumer or channel)."""
    with connection.cursor() as cur:
        cur.execute(Q.counters_forget.sql, [scope, owner_id])
        cur.execute(Q.counter_deltas_forget.sql, [scope, owner_id])


def counter_column(*, owner: str, scope: int, status: int | None = None) -> RawSQL:
    """A maintained count as a column of a queryset of ``owner`` rows (``"consumer"`` or
    ``"channel"``): of one ``status``, or of all of them; for the admin's lists, which sort on it."""
    column = _COLUMNS.get((owner, status is not None))
    if column is None:
        raise ValueError(f"no counter column for {owner!r} with status={status!r}")
    query, params = column
    return RawSQL(query.sql, params(scope, status))
