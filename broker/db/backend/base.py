"""Django's PostgreSQL backend with bounded round trips.

A database that stops answering without closing the connection (a hung server, a network
partition, a proxy that drops packets) would hold a psycopg call forever: libpq waits for the
answer as long as the socket stays open, and TCP keepalives only help while the link's other end
(a proxy, say) does not answer them itself. ``BoundedConnection`` gives up on a round trip that
got no answer within ``settings.BROKER_DB_TIMEOUT + DB_TIMEOUT_GRACE`` seconds: it closes the
connection and raises ``OperationalError`` (a request answers 503, a loop reconnects). The server
cancels a statement at ``BROKER_DB_TIMEOUT`` (``statement_timeout``, set per session), so on a live
link the server's cancel always comes first and the client-side bound only ever fires on a silent
one. 0 turns both off.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base

from broker.schema_editor import BrokerSchemaEditor

WAIT_INTERVAL = 0.1  # psycopg's: how often a wait looks for an interrupt (Ctrl-C)


_bound = threading.local()  # a thread's own bound (round_trip_bound)


def round_trip_limit() -> float | None:
    """Seconds a round trip may go unanswered, None when unbounded (BROKER_DB_TIMEOUT = 0 and no
    ``round_trip_bound`` around the calling thread)."""
    timeout = float(getattr(settings, "BROKER_DB_TIMEOUT", 0.0) or 0.0)
    if timeout > 0:
        return timeout + float(getattr(settings, "DB_TIMEOUT_GRACE", 2.0))
    return getattr(_bound, "seconds", None)


@contextmanager
def round_trip_bound(seconds: float):
    """The calling thread's round trips bounded at ``seconds`` while BROKER_DB_TIMEOUT is 0 (the
    publishing thread: a batch must end, its requests are waiting)."""
    _bound.seconds = seconds
    try:
        yield
    finally:
        _bound.seconds = None


class BoundedConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server (a query, a fetch, a commit) ends after
    ``round_trip_limit()`` seconds without an answer: the connection is closed and the call raises
    ``psycopg.OperationalError``. Connecting is bounded by libpq's ``connect_timeout``."""

    __slots__ = ()  # the same layout as psycopg.Connection: Django's connections are re-classed

    def wait(self, gen, interval: float = WAIT_INTERVAL, timeout: float | None = None):
        limit = round_trip_limit() if timeout is None else None
        if limit is None:
            return super().wait(gen, interval=interval, timeout=timeout)
        try:
            return super().wait(gen, interval=interval, timeout=limit)
        except psycopg.errors._WaitTimeout:  # psycopg's "the timeout given to wait() expired"
            self.pgconn.finish()  # the protocol state is unknown: nothing more may be sent on it
            raise psycopg.OperationalError(
                f"no answer from the database within {limit:g} s: connection closed") from None


def bounded_connect(**params) -> BoundedConnection:
    """A new ``BoundedConnection`` with libpq ``params`` (what ``psycopg.connect`` takes)."""
    return BoundedConnection.connect(**params)


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's PostgreSQL backend; each new connection is a ``BoundedConnection``. Migrations run
    through django-pg-zero-downtime-migrations' schema editor (``broker.schema_editor``: online DDL,
    lock timeouts, retries); it exists only while a migration runs."""

    SchemaEditorClass = BrokerSchemaEditor

    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        if type(connection) is psycopg.Connection:  # (a connection pool's are left as they are)
            connection.__class__ = BoundedConnection
        return connection
