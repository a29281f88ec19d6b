"""Management commands for operators: requeue_dead and broker_stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from broker.xid import job_xid
from jobs.models import Job, JobStatus, JobTransition
from jobs.state.transitions import DEAD
from tests.processes import ROOT
from tests.web.admin.conftest import dead_ids, finish

pytestmark = pytest.mark.django_db



def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("command", ["requeue_dead", "broker_stats"])
def test_help_text(command):
    """--help works from a shell (a subprocess: argparse exits)."""
    r = subprocess.run([sys.executable, "manage.py", command, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "BROKER_TESTING": "1"})  # DATABASE_URL: the test server
    assert r.returncode == 0, r.stderr
    assert "usage: manage.py " + command in r.stdout
    assert ("DEAD -> QUEUED" if command == "requeue_dead" else "deliveries per minute") in r.stdout


def test_requeue_dead_needs_a_selection(broker):
    with pytest.raises(CommandError, match="--channel"):
        run("requeue_dead")
    with pytest.raises(CommandError, match="--consumer needs --channel"):
        run("requeue_dead", "--all", "--consumer", "c1")
    with pytest.raises(CommandError, match="no such consumer"):
        run("requeue_dead", "--channel", "ch1", "--consumer", "nope")


def test_requeue_dead_dry_run_changes_nothing(broker):
    out = run("requeue_dead", "--channel", "ch1", "--dry-run")
    assert "ch1/c1: 2 dead jobs" in out and "ch1/c2: 0 dead jobs" in out
    assert len(dead_ids()) == 2


def test_requeue_dead_in_batches_with_progress(broker):
    finish("c1", 3, DEAD)  # 5 dead now
    out = run("requeue_dead", "--channel", "ch1", "--consumer", "c1", "--batch", "2")
    assert "ch1/c1: 2 / 5 requeued" in out and "ch1/c1: 4 / 5 requeued" in out and "ch1/c1: 5 / 5 requeued" in out
    assert "Requeued 5 dead jobs of 1 consumer" in out
    assert dead_ids() == []
    assert JobTransition.objects.filter(reason="cli-requeue", from_status=JobStatus.DEAD,
                                        to_status=JobStatus.QUEUED).count() == 5


def test_requeue_dead_selected_jobs_only(broker):
    first, second = dead_ids()
    out = run("requeue_dead", "--all", "--job", job_xid(first))  # the job ID the API and the admin show
    assert "Requeued 1 dead job of 2 consumers" in out
    assert Job.objects.get(pk=first).status == JobStatus.QUEUED and Job.objects.get(pk=second).status == JobStatus.DEAD
    with pytest.raises(CommandError, match="is not a job ID"):
        run("requeue_dead", "--all", "--job", str(second))  # the integer key is no job ID
    assert Job.objects.get(pk=second).status == JobStatus.DEAD


def test_broker_stats_table(broker):
    out = run("broker_stats")
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["consumer", "type", "queued", "in", "flight", "delivered"]
    c1 = next(line for line in lines if line.startswith("ch1/c1"))
    assert c1.split()[:6] == ["ch1/c1", "push", "4", "1", "3", "2"]
    assert "ERROR: ch1/c1: 2 dead jobs" in out


def test_broker_stats_json_and_check(broker):
    data = json.loads(run("broker_stats", "--json", "--channel", "ch1"))
    c2 = data["channels"][0]["consumers"][1]
    assert (c2["consumer"], c2["queued"], c2["dead"]) == ("c2", 10, 0)
    assert len(c2["delivered_per_minute_1h"]) == 60
    with pytest.raises(SystemExit) as exc:
        run("broker_stats", "--check")
    assert exc.value.code == 2
    with pytest.raises(CommandError, match="unknown channel: nope"):
        run("broker_stats", "--channel", "nope")


def test_broker_stats_check_passes_without_errors(world):
    world.publish()
    assert "c1" in run("broker_stats", "--check")
