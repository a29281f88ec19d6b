"""Read and compact the maintained counters (see ``broker.models.Counter``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from django.db import connection, transaction

JOB = 1
MESSAGE = 2
REDELIVERED = 2001  # pseudo status: QUEUED/INFLIGHT jobs with retry_count > 0


# The folded counts and the pending deltas of some (or all) owners of a scope: counter_key and
# counterdelta_owner.
_COUNTS_SQL = """
SELECT owner_id, status, sum(n)::bigint FROM (
    SELECT owner_id, status, count AS n FROM broker_counter
     WHERE scope = %(scope)s AND (%(ids)s::bigint[] IS NULL OR owner_id = ANY(%(ids)s::bigint[]))
    UNION ALL
    SELECT owner_id, status, delta FROM broker_counterdelta
     WHERE scope = %(scope)s AND (%(ids)s::bigint[] IS NULL OR owner_id = ANY(%(ids)s::bigint[]))
) x GROUP BY owner_id, status
"""


def counts_for(*, scope: int, owner_ids: Iterable[int] | None = None) -> dict[int, dict[int, int]]:
    """{owner_id: {status: count}} summing the folded counts and the pending deltas."""
    ids = list(owner_ids) if owner_ids is not None else None
    with connection.cursor() as cur:
        cur.execute(_COUNTS_SQL, {"scope": scope, "ids": ids})
        result: dict[int, dict[int, int]] = defaultdict(dict)
        for owner, status, n in cur.fetchall():
            result[owner][status] = int(n)
    return result


def counters_compact() -> int:
    """Fold pending deltas into the counter rows. One compactor at a time (advisory lock), so
    two never deadlock on counter rows. Returns the number of delta rows folded."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('broker_counters_compact'))")
        if not cur.fetchone()[0]:
            return 0
        cur.execute(
            """
            WITH d AS (DELETE FROM broker_counterdelta RETURNING scope, owner_id, status, delta),
            s AS (SELECT scope, owner_id, status, sum(delta) AS n, count(*) AS rows FROM d
                   GROUP BY scope, owner_id, status),
            i AS (INSERT INTO broker_counter (scope, owner_id, status, count)
                  SELECT scope, owner_id, status, n FROM s ORDER BY scope, owner_id, status
                  ON CONFLICT (scope, owner_id, status) DO UPDATE SET count = broker_counter.count + EXCLUDED.count)
            SELECT COALESCE(sum(rows), 0) FROM s
            """
        )
        return int(cur.fetchone()[0])


def counters_forget(*, scope: int, owner_id: int) -> None:
    """Drop the counters of a deleted owner (consumer or channel)."""
    with connection.cursor() as cur:
        cur.execute("DELETE FROM broker_counter WHERE scope = %s AND owner_id = %s", [scope, owner_id])
        cur.execute("DELETE FROM broker_counterdelta WHERE scope = %s AND owner_id = %s", [scope, owner_id])
