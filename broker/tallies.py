"""A process's counts kept in memory and written by a thread of its own at most once a period: a
request costs no write of its own (a shedding broker refuses thousands a second; a source may be
called as often), readers in any process see every process's counts, and a quiet process keeps no
thread busy and no connection open. A crash loses at most the last period's counts, never a message.
Used by sources.tallies (requests to inbound sources) and jobs.publish.refusals (publishes refused
for overload)."""

from __future__ import annotations

import logging
import threading

from django.db import connection

from broker.db.errors import DB_ERRORS

logger = logging.getLogger(__name__)


class TallyWriter:
    """The thread: asleep until ``wake`` (something was counted), then a ``flush`` per ``every``
    seconds while counts keep coming; its connection closed after ``idle_close`` seconds without."""

    def __init__(self, *, name: str, every: float = 1.0, idle_close: float = 30.0) -> None:
        self.name = name
        self.every = every
        self.idle_close = idle_close
        self.lock = threading.Lock()  # the subclass's counts are read and swapped under it
        self._pending = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def flush(self) -> int:
        """Write what is pending (the subclass's); the rows written. Raises DB_ERRORS, having put
        the counts back for the next try."""
        raise NotImplementedError

    def wake(self) -> None:
        """(holding ``lock``, after counting) The thread writes within ``every`` seconds."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        if not self._pending.is_set():
            self._pending.set()

    def close(self) -> None:
        """Write what is pending and stop the thread, closing its connection (tests, before the
        database is dropped)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._stopping.set()
        self._pending.set()
        thread.join(10)

    def _run(self) -> None:
        while True:
            if not self._pending.wait(self.idle_close):
                connection.close()  # a quiet spell keeps no connection
                continue
            self._stopping.wait(self.every)  # what comes meanwhile joins this write
            self._pending.clear()
            try:
                self.flush()
            except DB_ERRORS:
                logger.warning("%s: counts not written (the database is unavailable); retrying", self.name,
                               exc_info=True)
                connection.close()
                self._pending.set()
            if self._stopping.is_set():
                connection.close()
                return
