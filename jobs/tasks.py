"""django-q2 entry points for push delivery and the sweeps. Thin: the work is in jobs.push and
jobs.housekeeping. Tasks carry no payloads, only wake-ups (and at most an id).

How dispatcher loops stay running (``BROKER_PUSH_DISPATCHERS`` per cluster name):
- ``push_dispatch`` takes a *slot*: a session advisory lock (cluster name, slot number) on a
  connection of its own. A task that finds every slot taken returns at once, so surplus
  starts are harmless, and a worker killed with SIGKILL frees its slot with its connection.
- It then claims and delivers for ``BROKER_PUSH_LOOP_SECONDS`` (below the Q_CLUSTER timeout,
  which stays below retry). Two seconds before the end it enqueues its successor, which waits
  for the slot; at the end it releases the slot, so the successor takes over within ~25 ms
  while the old loop drains its callbacks in flight.
- A cut connection or a failover (docs/high-availability.md) ends no loop: the loop reconnects
  (jobs.push.dispatcher), ``Slot.keep`` takes the slot again every second on a new connection
  (or stops this loop when another took it meanwhile), a start during an outage waits for the
  database (``OUTAGE_WAIT``), and a hand-over that falls in one is retried within the task budget.
- Starts come from every django-q2 worker as it spawns (``on_worker_spawn``, connected in
  jobs/apps.py: a fresh or restarted cluster delivers within a second) and from the
  ``broker-push-ensure`` schedule every minute (``setup_schedules``) as the safety net.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection
from django_q.tasks import async_task

from broker.db.errors import DB_ERRORS, DB_RETRY
from broker.db.listen import dedicated_connect
from broker.queries import Q as BROKER_Q
from jobs.housekeeping import housekeeping_run
from jobs.pull.doorbell import doorbell_thread_start
from jobs.push.dispatcher import engine_get
from jobs.push.queries import Q

logger = logging.getLogger(__name__)
SLOT_POLL = 0.025
SLOT_CHECK = 1.0  # seconds between checks that the loop still holds its slot (Slot.keep)
OUTAGE_WAIT = 60.0  # a dispatcher started while the database is unreachable waits this long for it


class Slot:
    """A dispatcher slot: ``pg_try_advisory_lock(hashtext('broker-push:<cluster>'), n)`` held on a
    dedicated connection (Django's own may be closed and reopened by django-q2 between tasks).

    The lock lives as long as that connection: a cut connection (a proxy restart,
    ``pg_terminate_backend``, a failover) frees it, and ``keep`` takes it again on a new one."""

    def __init__(self) -> None:
        self.conn = None  # connected on first use
        self.key = f"broker-push:{settings.Q_CLUSTER.get('name', 'broker')}"
        self.number: int | None = None

    def _try(self, n: int) -> bool:
        if self.conn is None or self.conn.closed:
            self.conn = dedicated_connect(application_name="broker-push-slot")
        return bool(self.conn.execute(Q.dispatcher_slot_lock.sql, [self.key, n]).fetchone()[0])

    def acquire(self, slots: int, wait: float, *, outage: float = 0.0) -> int | None:
        """The first free slot, trying for ``wait`` seconds while all are taken (None after that).
        While the database cannot be reached it keeps trying for up to ``outage`` seconds, so a
        dispatcher started during an outage takes over as soon as the database is back; raises
        the database error after that."""
        deadline = time.monotonic() + max(0.0, wait)
        down_until = None
        while True:
            try:
                for n in range(slots):
                    if self._try(n):
                        self.number = n
                        return n
            except DB_ERRORS:
                self.release()
                now = time.monotonic()
                down_until = now + max(0.0, outage) if down_until is None else down_until
                if now >= max(deadline, down_until):
                    raise
                time.sleep(DB_RETRY)
                continue
            down_until = None
            if time.monotonic() >= deadline:
                return None
            time.sleep(SLOT_POLL)

    def keep(self) -> bool | None:
        """Whether this task still holds its slot: True (re-taken on a new connection after a cut
        one), False when another loop took it meanwhile, None while the database cannot be
        reached (asked again at the next check)."""
        if self.alive():
            return True
        self.release()
        try:
            return self._try(self.number)
        except DB_ERRORS:
            self.release()
            return None

    def alive(self) -> bool:
        if self.conn is None or self.conn.closed:
            return False
        try:
            self.conn.execute(BROKER_Q.db_ping.sql)
            return True
        except Exception:  # noqa: BLE001
            return False

    def release(self) -> None:
        """Closing the connection frees the lock (idempotent)."""
        if self.conn is not None and not self.conn.closed:
            self.conn.close()


def push_dispatch(wait: float = 0.0) -> str:
    """Run one dispatcher loop if a slot is free (see module docstring)."""
    slots = int(settings.BROKER_PUSH_DISPATCHERS or 0)
    if slots <= 0:
        return "push dispatch disabled (BROKER_PUSH_DISPATCHERS=0)"
    started = time.monotonic()
    # the whole task stays within django-q2's timeout (else the worker is killed mid-loop)
    budget = float(settings.Q_CLUSTER.get("timeout") or 150) - 10.0
    slot = Slot()
    try:
        try:
            number = slot.acquire(slots, wait, outage=OUTAGE_WAIT)
        except DB_ERRORS as exc:
            return f"database unavailable for {OUTAGE_WAIT:g} s ({type(exc).__name__}); no dispatcher loop"
        if number is None:
            return "every dispatcher slot is taken"

        doorbell_thread_start()  # this process's doorbell ringer thread (rings while it holds its lock)
        left = budget - (time.monotonic() - started)  # (less after waiting for the database)
        claim_for = max(5.0, min(float(settings.BROKER_PUSH_LOOP_SECONDS), left - 5.0))
        # Whatever stays running past the task budget is abandoned (redelivered after its deadline).
        drain_for = max(5.0, left - claim_for)
        handed_over, superseded = [], []
        stop = threading.Event()

        def hand_over() -> None:
            if not superseded:
                _enqueue_successor()
                handed_over.append(True)

        checked = [0.0]  # when the last check ended

        def keep() -> None:
            # checks that fell due together (a slow step, a silent connection: one check can take
            # seconds) run once, not back to back past the task's budget
            if time.monotonic() - checked[0] < SLOT_CHECK:
                return
            try:
                if slot.keep() is False:
                    superseded.append(True)
                    stop.set()  # drain and end: the loop that took the slot goes on (and hands over)
                    logger.warning("push dispatcher slot %s: taken by another loop after a lost connection; "
                                   "this loop stops", number)
            finally:
                checked[0] = time.monotonic()

        checks = [(t * SLOT_CHECK, keep) for t in range(1, int((claim_for - 2.0) / SLOT_CHECK))]
        stats = engine_get().run(claim_for=claim_for, drain_for=drain_for, wake_share=(number, slots), stop=stop,
                                 events=checks + [(max(0.0, claim_for - 2.0), hand_over), (claim_for, slot.release)])
        if not handed_over and not superseded:
            # The database was down at hand-over time: without a successor this slot would stay
            # empty until the minute schedule. Keep trying within the task budget.
            stats["late_hand_over"] = _enqueue_successor_retrying(budget - (time.monotonic() - started))
        logger.info("push dispatcher slot %s: %s", number, stats)
        return f"slot {number}: {stats}"
    finally:
        slot.release()


def _enqueue_successor_retrying(budget: float) -> bool:
    """Enqueue the successor, retrying every second for ``budget`` seconds (database outage)."""
    deadline = time.monotonic() + budget
    while True:
        try:
            _enqueue_successor()
            return True
        except DB_ERRORS:
            connection.close()
            if time.monotonic() + 1.0 > deadline:
                logger.error("push dispatcher: no successor enqueued (database unavailable); the "
                             "broker-push-ensure schedule starts one")
                return False
            time.sleep(1.0)


def _enqueue_successor() -> None:
    async_task("jobs.tasks.push_dispatch", 30.0, task_name="push-dispatch", save=False)


def push_dispatch_ensure() -> int:
    """Enqueue one dispatcher start per slot; those finding their slot taken return at once."""
    slots = int(settings.BROKER_PUSH_DISPATCHERS or 0)
    for _ in range(slots):
        async_task("jobs.tasks.push_dispatch", 0.0, task_name="push-dispatch", save=False)
    return slots


def maintenance() -> dict:
    """The fallback schedule (``broker-maintenance``, every minute): the housekeeping routine the
    dispatcher loops run, every step once, so nothing waits for a loop (BROKER_PUSH_DISPATCHERS=0)."""
    return housekeeping_run()


def on_worker_spawn(sender=None, proc_name=None, **kwargs) -> None:
    """django-q2 ``post_spawn``: each new worker asks for a dispatcher loop (surplus ones exit)."""
    if int(settings.BROKER_PUSH_DISPATCHERS or 0) <= 0 or settings.Q_CLUSTER.get("sync"):
        return
    try:
        async_task("jobs.tasks.push_dispatch", 0.0, task_name="push-dispatch", save=False)
    except Exception:  # noqa: BLE001 - the minute schedule starts it otherwise
        logger.exception("could not enqueue a push dispatcher at worker start")
    finally:
        connection.close()  # do not carry this connection into the worker's first task
