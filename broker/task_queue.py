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
from broker.queries import Q

logger = logging.getLogger(__name__)
ACK_ATTEMPTS = 6  # an acknowledgement is tried this many times (about 3 s) before it is left to django-q2


class OrmQueue(ORM):
    """django-q2's ORM broker whose reads and acknowledgements survive a database outage."""

    down_since: float | None = None

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
        try:
            if not self._due():
                time.sleep(Conf.POLL)  # as django-q2's own empty read
                return None
            tasks = super().dequeue()
        except DatabaseError as exc:
            self._failed("reading the queue", exc)
            return None
        self._ok()
        return tasks

    def _due(self) -> bool:
        """Whether a task of this queue can be taken now (the test of django-q2's read)."""
        with connections[Conf.ORM].cursor() as cur:
            cur.execute(Q.task_due.sql, [self.list_key, timezone.now()])
            return cur.fetchone()[0]

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
