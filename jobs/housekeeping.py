"""Housekeeping: the one routine of periodic repairs and clean-ups, a list of steps.

Every push dispatcher loop runs each step at its own period (``Housekeeping.run_due``; a step
marked ``in_loops=False`` is left to the schedule), and the django-q2 fallback schedule
``broker-maintenance`` (``jobs.tasks.maintenance``, once a minute) runs them all
(``housekeeping_run``), so with ``BROKER_PUSH_DISPATCHERS=0`` nothing is left out (a lost
partition settle included). A new step is one line in ``STEPS``; an app above jobs registers its
own with ``step_register`` (sources).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection

from broker.db.errors import DB_ERRORS
from broker.counters import counters_compact
from jobs.ops.plans import plans_watch
from jobs.partitions.settle import partitions_settle_stale
from jobs.publish.scheduled import scheduled_dispatch_due
from jobs.pull.doorbell import PRUNE_EVERY, doorbell_prune
from jobs.sweeps.inflight_timeout import jobs_expire_inflight
from jobs.sweeps.message_expiry import jobs_expire_messages
from jobs.sweeps.retention import RETENTION_EVERY, retention_sweep

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    key: str  # its count's name in the maintenance task's result
    run: Callable[[], int]
    every: float  # seconds between two runs in a dispatcher loop
    in_loops: bool = True  # False: only the fallback schedule runs it (slow work off the delivery loop)
    idle_every: float | None = None  # seconds between runs while it finds nothing to do (None: every)


STEPS: tuple[Step, ...] = (
    # in-flight jobs past their deadline: QUEUED again or DEAD (an idle broker looks every 3 s: a
    # deadline is seconds to minutes after its claim, and pull waiters sweep their own consumer)
    Step("expired", jobs_expire_inflight, 1.0, idle_every=3.0),
    Step("messages_expired", jobs_expire_messages, 1.0, idle_every=5.0),  # QUEUED jobs whose message expired: DEAD
    Step("scheduled", scheduled_dispatch_due, 1.0, idle_every=2.0),  # scheduled messages that are due: published
    # finished messages past their channel's retention: removed with their jobs, history, attempts
    # (bounded batches, at most half a second a call)
    Step("retention_removed", retention_sweep, RETENTION_EVERY),
    Step("settled", partitions_settle_stale, 1.0),  # partitions whose settle was lost (throttled inside)
    Step("compacted", counters_compact, 5.0),  # counter deltas folded into their rows
    Step("doorbells_pruned", doorbell_prune, PRUNE_EVERY),  # doorbell state of consumers without one
    # after an ANALYZE of the big tables the hot plans are checked: tens of EXPLAINs, kept off the
    # push loops (once a minute from the maintenance task)
    Step("plans_checked", plans_watch, 60.0, in_loops=False),
)


def step_register(step: Step) -> None:
    """A step of an app above jobs, from its ``AppConfig.ready()`` (``sources``: the expired dedupe
    rows), added to ``STEPS`` (once per key)."""
    global STEPS
    if step.key not in {s.key for s in STEPS}:
        STEPS = (*STEPS, step)


def step_run(step: Step) -> int | None:
    """One step; a failure is logged (a database error also drops the connection) so the other
    steps, and the loop that runs them (a push dispatcher), go on."""
    try:
        return step.run()
    except DB_ERRORS:  # psycopg's own too: the plan check runs on the raw connection
        logger.exception("housekeeping: %s failed", step.key)
        connection.close()
        return None
    except Exception:  # noqa: BLE001 - a step's bug must not stop push delivery
        logger.exception("housekeeping: %s failed", step.key)
        return None


def housekeeping_run(*, steps: tuple[Step, ...] | None = None) -> dict[str, int | None]:
    """Every step once (the fallback schedule): {step key: its count, None when it failed}."""
    return {step.key: step_run(step) for step in (STEPS if steps is None else steps)}


class Housekeeping:
    """A loop's clock over the steps: each is due at the loop's start, then every ``step.every`` s,
    or ``step.idle_every`` s after a run that found nothing to do (an idle broker stays quiet)."""

    def __init__(self, *, start: float | None = None, steps: tuple[Step, ...] | None = None) -> None:
        start = time.monotonic() if start is None else start
        self.steps = tuple(step for step in (STEPS if steps is None else steps) if step.in_loops)
        self.due = [start] * len(self.steps)  # one per step run here (a step left to the schedule has none)

    def run_due(self, now: float) -> None:
        for i, step in enumerate(self.steps):
            if now >= self.due[i]:
                self.due[i] = now + step.every
                if not step_run(step) and step.idle_every is not None:  # nothing (or a failure)
                    self.due[i] = now + max(step.every, step.idle_every)

    def next_due(self) -> float:
        return min(self.due)
