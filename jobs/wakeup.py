"""Wake-ups on new jobs: one LISTEN connection per process, many local waiters.

Publishing (and requeueing) sends ``pg_notify('broker_jobs', '<consumer pk>,<consumer pk>...')``
inside its transaction, delivered on commit. Each process that needs wake-ups (a web process
serving long-polls, a push worker) starts one daemon thread holding one autocommit connection
that LISTENs and bumps a per-consumer sequence number under a condition variable. Waiters never
hold a database connection while they sleep. Polling at ``fallback`` seconds stays as the safety
net (e.g. while the listener reconnects after a database restart).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

logger = logging.getLogger(__name__)

CHANNEL = "broker_jobs"
ANY = 0  # pseudo consumer id: bumped on every notification


class Wakeups:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq: dict[int, int] = defaultdict(int)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.connected = threading.Event()

    # --- listener ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the listener thread once per process (idempotent, thread-safe)."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="broker-listen", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _dsn(self) -> dict:
        from django.db import connection

        s = connection.settings_dict
        params = {"dbname": s["NAME"], "user": s.get("USER") or None, "password": s.get("PASSWORD") or None,
                  "host": s.get("HOST") or None, "port": s.get("PORT") or None}
        return {k: v for k, v in params.items() if v}

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._dsn(), autocommit=True, application_name="broker-listen") as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    self.notify_all()  # we may have missed notifications while (re)connecting
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._deliver(note.payload)
            except Exception as exc:  # noqa: BLE001 - reconnect on any database failure
                self.connected.clear()
                logger.warning("wake-up listener lost its connection (%s); retrying", type(exc).__name__)
                self.notify_all()
                time.sleep(1.0)

    def _deliver(self, payload: str) -> None:
        ids = []
        for part in (payload or "").split(","):
            try:
                ids.append(int(part))
            except ValueError:
                continue
        self.bump(ids)

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
