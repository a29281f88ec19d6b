"""Where the pipeline reads: the primary, or the replica named by ``BROKER_PIPELINE_DATABASE_URL``.

When that setting is given, ``broker.settings`` adds the Django alias ``pipeline`` for it, and every
read of the report, the archive and the notebook goes there: the JDBC reads (``pipeline.session``)
and the few small statements beside them (id bounds, the retention ledger, the consumers' retry
settings, the moment the data is as of). The archive's writes (its advisory lock, the prune) stay
on ``default``, the primary, and check there what they delete.

A replica with ``hot_standby_feedback`` off (docs/high-availability.md) may cancel a query that
holds back the replay of a row version it still sees ("conflict with recovery", SQLSTATE 40001 or
40P01). Each read is short (``pipeline.readers``: chunks), so this is rare; a chunk that is
cancelled fails its Spark task, which Spark runs again (``pipeline.session`` gives a local master
its task retries), and the small statements here are retried by ``replica_retry``.
"""

from __future__ import annotations

import functools
import time

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from pipeline.queries import Q

READ_ALIAS = "pipeline"
RECOVERY_CONFLICTS = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
CONFLICT_ATTEMPTS = 4
CONFLICT_PAUSE_S = 0.5


def read_alias() -> str:
    """The Django alias the pipeline reads through: ``pipeline`` when configured, else ``default``."""
    return READ_ALIAS if READ_ALIAS in connections.settings else DEFAULT_DB_ALIAS


def read_connection():
    return connections[read_alias()]


def recovery_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` (a Django or psycopg error) is a query cancelled by a replica's replay."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) in RECOVERY_CONFLICTS:
            return True
        exc = exc.__cause__
    return False


def replica_retry(fn):
    """Run ``fn`` again (after a short pause, on a fresh connection) when a replica cancelled it
    for a conflict with recovery; any other error, or the last attempt's, is raised."""

    @functools.wraps(fn)
    def retried(*args, **kwargs):
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except DatabaseError as exc:
                if attempt == CONFLICT_ATTEMPTS or not recovery_conflict(exc):
                    raise
                conn = read_connection()
                if not conn.in_atomic_block:
                    conn.close()  # a conflict may end the session too: the next use reconnects
                time.sleep(CONFLICT_PAUSE_S * attempt)
        raise AssertionError("unreachable")

    return retried


@replica_retry
def data_now():
    """The moment the data read is as of: ``now()`` on the primary; on a replica the time of the
    last commit it replayed, when earlier (a replica that lags must not call a day finished before
    the primary would)."""
    with read_connection().cursor() as cur:
        cur.execute(Q.data_now.sql)
        return cur.fetchone()[0]
