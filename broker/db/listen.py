"""Dedicated database connections beside Django's: the one helper for LISTEN connections (and for
connections that hold a session advisory lock).

Django's connection may be closed and reopened between tasks and requests, so a LISTEN (or a session
lock) needs a connection of its own: autocommit, named by ``application_name`` for
``pg_stat_activity``. ``Listener`` connects, LISTENs, runs an ``on_connect`` hook (a caller may have
missed notifications while it was away), reads notifications without blocking (for a select() loop)
or waits for them, and after a failure reconnects with backoff. Payloads are comma-separated ids
(``pg_notify('broker_jobs', '3,7')``).
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable, Sequence

import psycopg
from django.db import connection

from broker.db.backend.base import bounded_connect
from broker.db.run import session_bounds
from broker.queries import Q as BROKER_Q

logger = logging.getLogger(__name__)

BACKOFF = (0.25, 0.5, 1.0, 2.0)  # seconds before reconnect attempts 1, 2, 3, 4 and after (reset on success)


def dedicated_connect(*, application_name: str) -> psycopg.Connection:
    """An autocommit connection to Django's default database, outside Django's connection handling,
    with the libpq parameters Django's own connections get (every host of DATABASE_URL, its libpq
    parameters, the session options: jit = off) and the same bounds (a ``BoundedConnection``,
    the session's statement timeout)."""
    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    params["application_name"] = application_name
    conn = bounded_connect(**{k: v for k, v in params.items() if v not in (None, "")}, autocommit=True)
    bounds = session_bounds()
    if bounds is not None:
        try:
            conn.execute(BROKER_Q.session_settings_set.sql, bounds)
        except BaseException:
            conn.close()
            raise
    return conn


def payload_ids(payload: bytes | str) -> set[int]:
    """The ids of one notification payload (parts that are not integers are skipped)."""
    text = payload.decode(errors="replace") if isinstance(payload, bytes) else (payload or "")
    return {int(part) for part in text.split(",") if part.strip().isdigit()}


class Listener:
    """One dedicated LISTEN connection, (re)connected lazily: ``fileno()`` and ``wait()`` connect when
    the backoff allows; a failure closes the connection and schedules the next attempt."""

    def __init__(self, channels: Sequence[str], *, application_name: str,
                 on_connect: Callable[[psycopg.Connection], None] | None = None,
                 backoff: Sequence[float] = BACKOFF) -> None:
        self.channels = tuple(channels)
        self.application_name = application_name
        self.on_connect = on_connect
        self.backoff = tuple(backoff)
        self.conn: psycopg.Connection | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.received = 0  # notifications read so far (a payload may name no id)
        self.doomed = False  # the server said it ends this connection (a FATAL notice): lost at once

    # --- connection -------------------------------------------------------------------------------
    def connect(self) -> psycopg.Connection | None:
        """The live connection, connecting (LISTEN, then ``on_connect``) when none is open and the
        backoff has passed; None while the database is unreachable."""
        if self.conn is not None:
            return self.conn
        if time.monotonic() < self.retry_at:
            return None
        try:
            self.conn = dedicated_connect(application_name=self.application_name)
            self.doomed = False
            self.conn.add_notice_handler(self._notice)
            self.listen(*self.channels)
            if self.on_connect is not None:
                self.on_connect(self.conn)
        except Exception as exc:  # noqa: BLE001 - any failure: try again after the backoff
            self.lost(exc)
            return None
        if self.failures:
            logger.warning("%s: database connection back after %d attempts", self.application_name, self.failures)
        self.failures = 0
        return self.conn

    def _notice(self, diag) -> None:
        """A server that ends a connection (``pg_terminate_backend``, a shutdown, a crash of
        another backend) first sends a FATAL error; arriving while no query runs, libpq hands it to
        the notice handler and reports the loss only at the next read. Note it, so the read that
        brought it reports the loss (the dispatcher reconnects at once instead of a turn later)."""
        if diag.severity_nonlocalized in ("FATAL", "PANIC"):
            self.doomed = True

    def listen(self, *channels: str) -> None:
        """LISTEN on more channels (names are code constants, never input)."""
        for channel in channels:
            # not a registry query: LISTEN takes an identifier, not a parameter, and the names are constants
            self.conn.execute(f"LISTEN {channel}")

    def lost(self, exc: BaseException | None = None) -> None:
        """Close after a failure; the next attempt comes after the backoff."""
        if exc is not None and self.failures == 0:  # once per outage, not at every attempt
            logger.warning("%s: database connection lost (%s); reconnecting", self.application_name,
                           type(exc).__name__)
        self.close()
        self.retry_at = time.monotonic() + self.backoff[min(self.failures, len(self.backoff) - 1)]
        self.failures += 1

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self.conn = None

    # --- notifications ----------------------------------------------------------------------------
    def fileno(self) -> int | None:
        """The socket to select() on (connecting first), None while disconnected."""
        conn = self.connect()
        return conn.fileno() if conn is not None else None

    def drain(self) -> set[int] | None:
        """Ids notified since the last call, read without blocking (None: disconnected, so unknown)."""
        if self.conn is None:
            return None
        ids: set[int] = set()
        try:
            pgconn = self.conn.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                self.received += 1
                ids |= payload_ids(note.extra)
            if self.doomed or pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the server ended the connection")
        except Exception as exc:  # noqa: BLE001
            self.lost(exc)
            return None
        return ids

    def wait(self, timeout: float) -> set[int] | None:
        """Block up to ``timeout`` seconds for notifications; their ids (empty after a quiet
        timeout), or None while disconnected (after sleeping until the next attempt, at most
        ``timeout``)."""
        fd = self.fileno()
        if fd is None:
            time.sleep(max(0.0, min(timeout, self.retry_at - time.monotonic())))
            return None
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0.0, timeout) * 1000.0)
        except OSError as exc:
            self.lost(exc)
            return None
        return self.drain()
