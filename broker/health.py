"""Liveness of the database, for ``/_status``."""

from __future__ import annotations

from broker.db.run import query_fetchone
from broker.queries import Q


def database_ping() -> None:
    """One round trip to the database; raises whatever the driver raises when it does not answer."""
    query_fetchone(Q.db_ping)
