"""django-q2's task queue in PostgreSQL (its ORM broker), riding out database outages.

django-q2's own ORM broker lets a database error escape: the cluster's pusher process logs
"Failed to pull task from broker", sleeps 10 s and exits, and the sentinel starts another one
("reincarnated pusher"); an error while the monitor acknowledges a finished task ends the monitor
the same way. Push delivery hangs on that queue (each dispatcher loop hands over to its successor
through it, jobs/tasks.py), so a cut connection or a failover stopped it for 10 s or more, and
restarted processes. ``OrmQueue`` (``Q_CLUSTER["broker_class"]``) keeps them running: a failed
read is an empty read after a short pause (the connection is dropped, so the next read connects
again: to the new primary after a failover), and an acknowledgement is retried a few times before
it is left to django-q2's own retry (the task runs again after ``Q_CLUSTER["retry"]``; the
broker's tasks are safe to repeat).

An empty queue is not polled: every enqueue sends a NOTIFY (``TASK_CHANNEL``, delivered at its
commit) and the reader LISTENs, so a task is taken at once and an idle cluster reads its queue
every ``TASK_WAIT`` seconds (a task django-q2 puts back after its retry period, or a lost
wake-up), not every ``Q_CLUSTER["poll"]``. The reader still returns every ``Q_CLUSTER["poll"]``
(an empty read without a statement), because django-q2's pusher looks at its stop event only
between reads: a cluster's stop is not held up by the longer wait. Without the LISTEN connection
it reads every ``Q_CLUSTER["poll"]`` as before.
"""

from __future__ import annotations

import logging
import time

from django.db import Error as DatabaseError
from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf

from broker.db.errors import DB_RETRY
from broker.db.listen import Listener
from broker.queries import Q

logger = logging.getLogger(__name__)
ACK_ATTEMPTS = 6  # an acknowledgement is tried this many times (about 3 s) before it is left to django-q2
TASK_CHANNEL = "broker_tasks"  # NOTIFY channel of the task queue: a task was enqueued
TASK_WAIT = 5.0  # seconds an empty queue waits for that NOTIFY before it is read again


class OrmQueue(ORM):
    """django-q2's ORM broker whose reads and acknowledgements survive a database outage."""

    down_since: float | None = None
    listener: Listener | None = None  # the reader's LISTEN connection (made at its first read)
    read_at = 0.0  # (monotonic) the next read without a NOTIFY: the safety net

    def _failed(self, what: str, exc: BaseException) -> None:
        connections[Conf.ORM].close()  # the next attempt connects again
        if self.down_since is None:
            self.down_since = time.monotonic()
            logger.warning("task queue: %s failed (%s: %s); retrying every %g s", what, type(exc).__name__,
                           str(exc).strip().splitlines()[0] if str(exc).strip() else "", DB_RETRY)
        time.sleep(DB_RETRY)

    def _ok(self) -> None:
        if self.down_since is not None:
            logger.warning("task queue: database back after %.1f s", time.monotonic() - self.down_since)
            self.down_since = None

    def dequeue(self):
        """The next tasks, or None (also while the database is unavailable: an empty read). The
        queue is nearly always empty (its tasks are the dispatcher loops' hand-overs and the
        minute's schedules), so it is first looked at with one plain statement: django-q2's ORM
        query, built twice a second, was the largest share of an idle cluster's CPU."""
        if self.listener is None:
            self.listener = Listener([TASK_CHANNEL], application_name="broker-task-listen")
        listening = self.listener.fileno() is not None  # LISTEN before the look: no enqueue falls between
        now = time.monotonic()
        if listening and now < self.read_at:
            before = self.listener.received
            if self.listener.wait(min(Conf.POLL, self.read_at - now)) is not None and self.listener.received == before:
                return None  # quiet: the pusher looks at its stop event, then calls again
        self.read_at = time.monotonic() + TASK_WAIT  # read now (a NOTIFY, the safety net, no listener)
        try:
            if not self._due():
                if not listening:
                    time.sleep(Conf.POLL)  # as django-q2's own empty read
                return None
            tasks = super().dequeue()
        except DatabaseError as exc:
            self._failed("reading the queue", exc)
            return None
        self._ok()
        self.read_at = 0.0  # django-q2 takes a few tasks a read: look again at once for the rest
        return tasks

    def _due(self) -> bool:
        """Whether a task of this queue can be taken now (the test of django-q2's read)."""
        with connections[Conf.ORM].cursor() as cur:
            cur.execute(Q.task_due.sql, [self.list_key, timezone.now()])
            return cur.fetchone()[0]

    def enqueue(self, task):
        """django-q2's enqueue, then the wake-up of the readers (delivered when the enqueue
        commits). A wake-up that fails is only logged: the readers look again within TASK_WAIT."""
        task_id = super().enqueue(task)
        try:
            with connections[Conf.ORM].cursor() as cur:
                cur.execute(Q.notify_send.sql, [TASK_CHANNEL, ""])
        except DatabaseError as exc:
            logger.warning("task queue: wake-up NOTIFY not sent (%s); readers look within %g s",
                           type(exc).__name__, TASK_WAIT)
        return task_id

    def delete(self, task_id):
        """Remove a finished task, retried through a short outage; then left to django-q2's retry."""
        for attempt in range(ACK_ATTEMPTS):
            try:
                result = super().delete(task_id)
            except DatabaseError as exc:
                self._failed("acknowledging a task", exc)
                continue
            self._ok()
            return result
        logger.warning("task queue: task %s not acknowledged (database unavailable); django-q2 runs it again "
                       "after its retry period", task_id)
        return None
