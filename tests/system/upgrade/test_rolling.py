"""A rolling upgrade from the previous release to this tree, under traffic, on a 100k-job backlog.

``bench/upgrade.py`` does the work (docs/upgrades.md: the previous release checked out with ``git
worktree`` and run from a virtualenv built from its own pyproject.toml, a backlog written with SQL,
publishes, a push consumer and a pull consumer acking with receipts; then ``migrate`` and a
migration over the 100k-job tables (a column added, an index built concurrently), new web beside
old, old web stopped, workers swapped with the old cluster stopped as systemd's default KillMode
does (SIGTERM to its group, SIGKILL after the grace), and one new cluster stopped with SIGTERM to
its main process for another). This test runs it with the suite's sizes and asserts the contract
on its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.upgrade import PREVIOUS_RELEASE, problems_of
from tests.processes import ROOT, child_env
from tests.processes import test_database_url as database_url

pytestmark = pytest.mark.slow


def test_previous_release_is_in_this_repository_history():
    """The named commit is an ancestor of this tree (CI runs in a clean clone of main)."""
    found = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", PREVIOUS_RELEASE, "HEAD"])
    assert found.returncode == 0, f"{PREVIOUS_RELEASE} is not in this repository's history"


def test_rolling_upgrade_under_traffic(tmp_path):
    out = tmp_path / "figures.json"
    env = child_env(DATABASE_URL=database_url())
    run = subprocess.run([sys.executable, "bench/upgrade.py", "--jobs", "100000", "--rate", "50", "--seconds", "2",
                          "--grace", "8", "--json", str(out), "--logs", str(tmp_path / "logs")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(run.stdout)
    assert out.exists(), f"no figures (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    figures = json.loads(out.read_text())
    assert figures["jobs"] == 100000 and figures["previous"] == PREVIOUS_RELEASE
    assert figures["published"] > 100, figures
    # the contract (issue 31): no 5xx but 503 with Retry-After, no stall or push pause of 2 s, a
    # cluster asked to stop exits within its grace, nothing acknowledged lost, nothing outside
    # at-least-once (every job of both consumers DELIVERED, nothing delivered that was not published)
    assert problems_of(figures) == [], json.dumps(figures, indent=2)
    assert figures["answers"].get("publish 201", 0) == figures["published"]
    assert set(figures["final_states"]) == {"pushed", "pulled"}
    # both ways of stopping a cluster, each followed by the next one holding every slot within 2 s
    assert figures["old_qcluster_stop"]["group"] and not figures["new_qcluster_stop"]["group"]
    assert figures["big_table_migration"]["jobs_rows"] >= 100000, figures["big_table_migration"]
    assert run.returncode == 0, run.stderr[-3000:]
