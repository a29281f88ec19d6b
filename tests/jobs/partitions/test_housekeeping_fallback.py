"""The housekeeping routine without dispatcher loops (BROKER_PUSH_DISPATCHERS=0): django-q2's
fallback schedule ``broker-maintenance`` runs every step, so a lost partition settle is repaired."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Schedule
from django_q.scheduler import scheduler

from jobs.housekeeping import STEPS
from jobs.models import Partition
from jobs.partitions import settle
from jobs.tasks import maintenance, push_dispatch
from tests.jobs.partitions.test_pull_partitions import pull_ids, settle_lose

pytestmark = pytest.mark.django_db(transaction=True)


def test_without_dispatchers_the_fallback_schedule_repairs_a_lost_settle(pull_world, parts, pc, settings,
                                                                         monkeypatch):
    settings.BROKER_PUSH_DISPATCHERS = 0
    assert push_dispatch() == "push dispatch disabled (BROKER_PUSH_DISPATCHERS=0)"  # no loop will sweep
    monkeypatch.setattr(settle, "_stale_next", 0.0)  # this process has not settled in the last 10 s
    p = settle_lose(parts, pc)  # gate 0 done, its settle lost: nothing to pull

    call_command("setup_schedules", verbosity=0)
    Schedule.objects.filter(name="broker-maintenance").update(next_run=timezone.now() - timedelta(seconds=1))
    scheduler()  # django-q2's scheduler pass: the due schedules run (inline: Q_CLUSTER sync in tests)

    assert Partition.objects.get(pk=p.pk).gate == 1
    [b] = pull_ids(pc)
    assert b["Gate"] == 1


def test_the_fallback_runs_every_step_the_loops_run():
    result = maintenance()
    assert set(result) == {step.key for step in STEPS}
    assert {"expired", "scheduled", "settled", "compacted", "doorbells_pruned"} <= set(result)
    assert all(isinstance(count, int) for count in result.values()), result
