"""django-q2's per-task INFO lines are quiet by default (BROKER_Q_TASK_LOG brings them back); its
banner, warnings and failures stay."""

from __future__ import annotations

import logging
import time

import pytest

from broker.logs import QuietTaskHeartbeat
from tests.processes import start_qcluster

# The lines django-q2 1.8 writes (django_q/tasks.py, scheduler.py, worker.py, monitor.py, cluster.py).
PER_TASK = [
    "Enqueued [broker] 42",
    "Process-1 created task hotel-uncle-earth-ten from schedule [broker-maintenance]",
    "Process-1:2 processing hotel-uncle-earth-ten 'jobs.tasks.maintenance'",
    "Process-1:2 processing ack-lion 'jobs.tasks.push_dispatch' [broker-push]",
    "Processed 'jobs.tasks.maintenance' (hotel-uncle-earth-ten)",
]
EVENTS = [
    "Q Cluster hotel-uncle starting.",
    "Process-1:1 ready for work at 4242",
    "Process-1:3 monitoring at 4244",
    "Process-1 guarding cluster hotel-uncle [broker]",
    "Q Cluster hotel-uncle [broker] running.",
    "recycled worker Process-1:2",
    "Q Cluster hotel-uncle stopping.",
]


def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("django-q", level, __file__, 1, message, (), None)


def test_filter_drops_per_task_lines_only():
    quiet = QuietTaskHeartbeat()
    assert [m for m in PER_TASK if quiet.filter(record(m))] == []
    assert [m for m in EVENTS if not quiet.filter(record(m))] == []
    # failures and warnings always pass, whatever they say
    assert quiet.filter(record("Failed 'jobs.tasks.maintenance' (x) - boom", logging.ERROR))
    assert quiet.filter(record("Process-1:2 processing x 'f'", logging.WARNING))


def run_tasks(tmp_path, n: int, **env) -> str:
    """Start a qcluster, have it run ``n`` tasks of our own, stop it; its console output."""
    from django_q.conf import Conf
    from django_q.models import Success
    from django_q.tasks import async_task

    before = Success.objects.filter(func="math.floor").count()
    # (the tasks are signed with this process's key: the cluster must have the same one)
    cluster = start_qcluster(tmp_path, BROKER_Q_WORKERS="2", BROKER_LOG_FORMAT="plain", DJANGO_SECRET_KEY=Conf.SECRET_KEY,
                             **env)
    try:
        for i in range(n):
            async_task("math.floor", 1.5 + i, sync=False)  # through the ORM queue, not in this process
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and Success.objects.filter(func="math.floor").count() < before + n:
            time.sleep(0.3)
        assert Success.objects.filter(func="math.floor").count() == before + n, cluster.output()[-3000:]
    finally:
        cluster.stop()
    return cluster.output()


@pytest.mark.django_db(transaction=True)
def test_qcluster_console_is_quiet_by_default(tmp_path):
    text = run_tasks(tmp_path, 3)
    assert "Q Cluster" in text and "running." in text and "ready for work" in text, text[-3000:]
    assert "'math.floor'" not in text and " processing " not in text and "Processed '" not in text, text[-3000:]
    assert "Enqueued [" not in text
    loud = run_tasks(tmp_path, 3, BROKER_Q_TASK_LOG="true")
    assert loud.count("processing") >= 3 and "Processed 'math.floor'" in loud, loud[-3000:]
