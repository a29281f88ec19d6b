"""NOTIFY after the commit, at most one per interval per process: wake-ups off the durable path.

A ``pg_notify`` inside a publishing transaction makes PostgreSQL take its cluster-wide NOTIFY lock at
commit and hold it through the commit's WAL flush, so notifying commits queue one behind the other
instead of sharing a flush; and every NOTIFY wakes every listening backend and process. Publishes
therefore commit without one, and hand the consumers that got jobs to this process's ``Notifier``:
a daemon thread sends one ``pg_notify`` for everything handed over since its last one, on a
dedicated autocommit connection with ``synchronous_commit = off`` (a wake-up is not data: a lost
one is covered by the listeners' safety-net polls), at once after a quiet spell and otherwise at
most once per ``BROKER_NOTIFY_INTERVAL`` seconds. Local subscribers (this process's own pull
waiters) are told at once, without the round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from django.conf import settings

from broker.db.errors import DB_ERRORS
from broker.db.listen import dedicated_connect
from broker.queries import Q

logger = logging.getLogger(__name__)
PAYLOAD_MAX = 7900  # bytes: PostgreSQL refuses payloads of 8000 or more


def payloads(ids: Iterable[int]) -> list[str]:
    """Comma-separated ids in payloads under PostgreSQL's limit (several when there are many)."""
    out, part, size = [], [], 0
    for text in sorted(str(i) for i in ids):
        if part and size + len(text) + 1 > PAYLOAD_MAX:
            out.append(",".join(part))
            part, size = [], 0
        part.append(text)
        size += len(text) + 1
    if part:
        out.append(",".join(part))
    return out


class Notifier:
    """One per process and channel: ``send`` returns at once; the thread sends the NOTIFY."""

    def __init__(self, channel: str, *, interval: float | None = None) -> None:
        self.channel = channel
        self.interval = interval
        self.subscribers: list[Callable[[set[int]], None]] = []
        self._pending: set[int] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._conn = None
        self._io = threading.Lock()  # the connection: the thread's NOTIFY, or close()
        self.sent = 0  # NOTIFY statements sent (tests, benchmarks)

    def subscribe(self, callback: Callable[[set[int]], None]) -> None:
        """Call ``callback(ids)`` at once on every ``send`` of this process (idempotent)."""
        if callback not in self.subscribers:
            self.subscribers.append(callback)

    def send(self, ids: Iterable[int]) -> None:
        """Wake the listeners of ``ids`` (call after the commit that made their jobs visible)."""
        ids = set(ids)
        if not ids:
            return
        for callback in self.subscribers:
            callback(ids)
        with self._cond:
            self._pending |= ids
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"notify-{self.channel}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        interval = self.interval if self.interval is not None else float(settings.BROKER_NOTIFY_INTERVAL)
        last = 0.0
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                # gather what arrives until the interval since the last NOTIFY is over
                while (hold := last + interval - time.monotonic()) > 0:
                    self._cond.wait(hold)
                ids, self._pending = self._pending, set()
            last = time.monotonic()
            self._notify(ids)

    def close(self) -> None:
        """Close the connection (the next NOTIFY opens another): before a test database is dropped."""
        with self._io:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _notify(self, ids: set[int]) -> None:
        with self._io:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = dedicated_connect(application_name="broker-notify")
                    self._conn.execute(Q.notify_session_setup.sql)
                for payload in payloads(ids):
                    self._conn.execute(Q.notify_send.sql, [self.channel, payload])
                    self.sent += 1
            except DB_ERRORS as exc:  # the listeners' polls cover a lost wake-up
                logger.warning("wake-up NOTIFY not sent (%s); listeners poll", type(exc).__name__)
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
