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
- Starts come from every django-q2 worker as it spawns (``on_worker_spawn``, connected in
  jobs/apps.py: a fresh or restarted cluster delivers within a second) and from the
  ``broker-push-ensure`` schedule every minute (``setup_schedules``) as the safety net.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection
from django_q.tasks import async_task

from broker.db.listen import dedicated_connect
from broker.queries import Q as BROKER_Q
from jobs.housekeeping import housekeeping_run
from jobs.pull.doorbell import doorbell_thread_start
from jobs.push.dispatcher import engine_get
from jobs.push.queries import Q

logger = logging.getLogger(__name__)
SLOT_POLL = 0.025


class Slot:
    """A dispatcher slot: ``pg_try_advisory_lock(hashtext('broker-push:<cluster>'), n)`` held on a
    dedicated connection (Django's own may be closed and reopened by django-q2 between tasks)."""

    def __init__(self) -> None:
        self.conn = dedicated_connect(application_name="broker-push-slot")
        self.key = f"broker-push:{settings.Q_CLUSTER.get('name', 'broker')}"
        self.number: int | None = None

    def acquire(self, slots: int, wait: float) -> int | None:
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            for n in range(slots):
                row = self.conn.execute(Q.dispatcher_slot_lock.sql, [self.key, n]).fetchone()
                if row[0]:
                    self.number = n
                    return n
            if time.monotonic() >= deadline:
                return None
            time.sleep(SLOT_POLL)

    def alive(self) -> bool:
        try:
            self.conn.execute(BROKER_Q.db_ping.sql)
            return True
        except Exception:  # noqa: BLE001
            return False

    def release(self) -> None:
        """Closing the connection frees the lock (idempotent)."""
        if not self.conn.closed:
            self.conn.close()


def push_dispatch(wait: float = 0.0) -> str:
    """Run one dispatcher loop if a slot is free (see module docstring)."""
    slots = int(settings.BROKER_PUSH_DISPATCHERS or 0)
    if slots <= 0:
        return "push dispatch disabled (BROKER_PUSH_DISPATCHERS=0)"
    slot = Slot()
    try:
        number = slot.acquire(slots, wait)
        if number is None:
            return "every dispatcher slot is taken"

        doorbell_thread_start()  # this process's doorbell ringer thread (rings while it holds its lock)
        claim_for = float(settings.BROKER_PUSH_LOOP_SECONDS)
        # Whatever stays running past the task budget is abandoned (redelivered after its deadline).
        drain_for = max(5.0, float(settings.Q_CLUSTER.get("timeout") or 150) - claim_for - 10.0)
        started = time.monotonic()
        handed_over = []

        def hand_over() -> None:
            _enqueue_successor()
            handed_over.append(True)

        stats = engine_get().run(claim_for=claim_for, drain_for=drain_for, wake_share=(number, slots), events=[
            (max(0.0, claim_for - 2.0), hand_over),
            (claim_for, slot.release),
        ])
        if not handed_over:
            # The database was down at hand-over time (chaos test): without a successor this slot
            # would stay empty until the minute schedule. Keep trying within the task budget.
            budget = float(settings.Q_CLUSTER.get("timeout") or 150) - 5.0 - (time.monotonic() - started)
            stats["late_hand_over"] = _enqueue_successor_retrying(budget)
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
        except DatabaseError:
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
