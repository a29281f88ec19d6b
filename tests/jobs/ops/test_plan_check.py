"""The plan check on a live database (jobs.ops.plans): ``manage.py broker_plans`` and the housekeeping
watch after an ANALYZE, and /metrics ``broker_plan_regressions``. A regression is made the way a
planner makes one: the same statements planned under settings that take their index walks away."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command
from django.db import connection

from jobs.models import PlanCheck
from jobs.ops.plans import CASES, PLAN_MIN_ROWS, plan_regressions_count, plans_watch

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = PLAN_MIN_ROWS * 2
NO_INDEX_WALKS = ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan")


@pytest.fixture
def backlog(make):
    """A pull consumer with a backlog big enough for its plans to be judged, analyzed."""
    make.basics()
    make.consumer("c1", type="pull", callback=None)
    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                        headers, status, received_at, dispatched_at)
            SELECT c.id, 'pc' || g, p.id, '\\x7b7d', 'application/json', 0, '{}', 102, now(), now()
              FROM generate_series(1, %s) g, broker_channel c, broker_producer p
             WHERE c.channel_id = 'ch1' AND p.producer_id = 'p1'""", [JOBS])
        cur.execute("""
            INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                                  incremental_timeout, status_changed_at, created_at, gate)
            SELECT m.id, k.id, m.channel_id, 1001, 0, 0, now(), 0, now(), now(), 0
              FROM broker_message m JOIN consumers_consumer k ON k.channel_id = m.channel_id""")
        cur.execute("ANALYZE jobs_job")
        cur.execute("ANALYZE broker_message")
        cur.execute("SELECT pg_stat_clear_snapshot()")
    yield
    with connection.cursor() as cur:
        for name in NO_INDEX_WALKS:
            cur.execute(f"RESET {name}")


def _no_index_walks():
    with connection.cursor() as cur:
        for name in NO_INDEX_WALKS:
            cur.execute(f"SET {name} = off")


def _analyze():
    with connection.cursor() as cur:
        cur.execute("ANALYZE jobs_job")
        cur.execute("SELECT pg_stat_clear_snapshot()")


def test_broker_plans_passes_on_healthy_plans_and_exits_1_when_a_statement_leaves_its_index(backlog, capsys):
    call_command("broker_plans")  # no SystemExit: every plan uses its index
    out = capsys.readouterr().out
    assert "jobs.pull:claim_pull " in out and "job_push_fresh" in out and f"{len(CASES)} plans, 0 regressions" in out
    _no_index_walks()
    with pytest.raises(SystemExit) as exit_:
        call_command("broker_plans", "--custom")
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    claim = next(line for line in out.splitlines() if line.startswith("jobs.pull:claim_pull "))
    assert "LEFT ITS INDEX" in claim and "Seq Scan on jobs_job" in claim


def test_the_watch_checks_after_each_analyze_and_warns_naming_the_statement(backlog, caplog, api):
    assert plans_watch() == len(CASES)  # the backlog's ANALYZE had not been checked yet
    assert PlanCheck.objects.count() == len(CASES) and plan_regressions_count() == 0
    assert plans_watch() == 0  # nothing analyzed since
    _no_index_walks()
    _analyze()
    with caplog.at_level(logging.WARNING, logger="jobs.ops.plans"):
        assert plans_watch() == len(CASES)
    warned = {r.statement for r in caplog.records if r.levelno == logging.WARNING}
    assert "jobs.pull:claim_pull" in warned and "jobs.pull:queued_jobs" in warned
    regressions = plan_regressions_count()
    assert regressions >= 2
    metrics = api.get("/metrics").content.decode()
    assert f"broker_plan_regressions {float(regressions)}" in metrics
