"""Wake-ups on new jobs: one LISTEN connection per process, many local waiters.

Publishing sends ``pg_notify('broker_jobs', '<consumer pk>,<consumer pk>...')`` after its commit
(``jobs.publish.wakeup``: debounced per process; this process's own waiters are woken at once,
without the round trip); requeueing sends it inside its transaction, delivered on commit. Each process that needs wake-ups (a web process
serving long-polls, a push worker) starts one daemon thread holding one autocommit connection
that LISTENs and bumps a per-consumer sequence number under a condition variable. Waiters never
hold a database connection while they sleep. Polling at ``fallback`` seconds stays as the safety
net (e.g. while the listener reconnects after a database restart).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

from broker.db.listen import Listener
from jobs.publish.wakeup import CHANNEL, jobs_notifier
ANY = 0  # pseudo consumer id: bumped on every notification


class Wakeups:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq: dict[int, int] = defaultdict(int)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.connected = threading.Event()
        self.epoch = 0  # LISTEN connections made or lost so far: a change means the server may have restarted

    # --- listener ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the listener thread once per process (idempotent, thread-safe)."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            jobs_notifier.subscribe(self.bump)  # this process's own publishes wake its waiters at once
            self._thread = threading.Thread(target=self._run, name="broker-listen", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        """Bump waiters on each notification; on (re)connect and on a lost connection wake every
        waiter (notifications may have been missed), so the poll fallback takes over at once."""
        listener = Listener([CHANNEL], application_name="broker-listen", on_connect=self._connected)
        try:
            while not self._stop.is_set():
                before = listener.received
                ids = listener.wait(1.0)
                if ids is None:
                    if self.connected.is_set():
                        self.connected.clear()
                        self.epoch += 1
                        self.notify_all()
                elif listener.received != before:
                    self.bump(ids)
        finally:
            listener.close()

    def _connected(self, conn) -> None:
        self.epoch += 1
        self.connected.set()
        self.notify_all()  # we may have missed notifications while (re)connecting

    # --- local API -----------------------------------------------------------------------------
    def bump(self, consumer_ids) -> None:
        with self._cond:
            for cid in consumer_ids:
                self._seq[cid] += 1
            self._seq[ANY] += 1
            self._cond.notify_all()

    def notify_all(self) -> None:
        """Wake every waiter (used on reconnect, and by processes that changed state locally)."""
        with self._cond:
            for key in list(self._seq):
                self._seq[key] += 1
            self._seq[ANY] += 1
            self._cond.notify_all()

    def mark(self, consumer_id: int = ANY) -> int:
        """Current sequence number; pass it to ``wait`` to not miss a wake-up that happens
        between your last database check and the wait."""
        with self._cond:
            return self._seq[consumer_id]

    def wait(self, consumer_id: int, since: int, timeout: float) -> bool:
        """Sleep until ``consumer_id`` is notified after ``since`` or ``timeout`` passes.
        True when woken by a notification."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._seq[consumer_id] == since:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True


wakeups = Wakeups()


_kept = 0  # waiting pulls of this process that keep their connection now
_kept_lock = threading.Lock()


@contextmanager
def connection_parked():
    """Around a waiting pull's sleep: its connection (idle: autocommit, no transaction) is kept while
    fewer than ``BROKER_PULL_WAIT_CONNECTIONS`` waiters of this process keep theirs, else closed, so
    many long-polls never hold many connections. A kept one is reused warm when the pull wakes: a
    closed one costs a new backend, which prepares the pull's statements and compiles the job
    triggers again (measured: ~3 ms of database CPU on the first claim of a new backend).

    A kept connection is closed after the sleep when the process's LISTEN connection was lost or
    made again meanwhile (a restart or a failover, which ended the kept one too): the claim that
    follows then connects anew instead of failing on a dead socket."""
    global _kept
    keep = False
    epoch = wakeups.epoch
    if not connection.in_atomic_block:  # (inside a caller's transaction there is nothing to release)
        with _kept_lock:
            keep = _kept < settings.BROKER_PULL_WAIT_CONNECTIONS
            _kept += keep
        if not keep:
            connection.close()
    try:
        yield
    finally:
        if keep:
            with _kept_lock:
                _kept -= 1
            if wakeups.epoch != epoch:
                connection.close()
