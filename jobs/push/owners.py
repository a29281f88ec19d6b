"""A push dispatcher engine's owner row (``jobs_pushowner``): registered on its LISTEN connection,
so whatever ends the process (a clean stop, SIGKILL, a lost host) ends the backend the row names,
and the next housekeeping run anywhere puts its claims back in the queue (jobs.sweeps.orphans)."""

from __future__ import annotations

import secrets

import psycopg

from broker.db.run import query_execute
from jobs.push.queries import Q


def owner_id_new() -> int:
    """A random positive bigint: unique without a sequence shared by every engine."""
    return secrets.randbits(62) + 1


def push_owner_register(*, conn: psycopg.Connection, owner_id: int) -> None:
    """Name ``conn``'s backend as ``owner_id``'s (at every (re)connect of the engine's listener: a
    new backend replaces the old one's row)."""
    conn.execute(Q.push_owner_register.sql, {"owner": owner_id})


def push_owner_lag_report(*, owner_id: int, lag: float) -> None:
    """Write ``owner_id``'s delivery lag (jobs.push.lag) in the caller's transaction."""
    query_execute(Q.push_owner_lag, {"owner": owner_id, "lag": lag})
