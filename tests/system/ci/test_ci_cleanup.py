""".ci/run stops only what its own run started (by pid and the run's environment mark), never
other brokers by name: a qcluster that is not the run's survives the clean-up."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.processes import ROOT, child_env, start_qcluster, wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # the qclusters read the test database


def group_pids(pgid: int) -> set[int]:
    """Live (not zombie) processes of a process group."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.add(int(name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_reap_stops_the_runs_processes_and_leaves_an_unrelated_qcluster(tmp_path):
    mark = f"test-{uuid.uuid4().hex}"
    unrelated = start_qcluster(tmp_path)
    ours = start_qcluster(tmp_path, BROKER_CI_RUN=mark)
    try:
        # both clusters are up with their worker processes (a cluster forks several)
        assert wait_for(lambda: len(group_pids(ours.pid)) >= 3 and len(group_pids(unrelated.pid)) >= 3), (
            ours.output()[-2000:], unrelated.output()[-2000:])
        theirs_before = group_pids(unrelated.pid)
        env = {k: v for k, v in os.environ.items() if k != "BROKER_CI_RUN"}
        result = subprocess.run([sys.executable, str(ROOT / ".ci" / "reap.py"), mark, "--grace", "3"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "left by this run" in result.stderr
        ours.popen.wait(timeout=10)  # the run's qcluster is gone (SIGKILL if SIGTERM hung) ...
        assert wait_for(lambda: not group_pids(ours.pid), timeout=10), "... and its workers with it"
        assert unrelated.popen.poll() is None, "the unrelated qcluster is still running"
        assert theirs_before <= group_pids(unrelated.pid), "with all of its workers"
    finally:
        ours.stop()
        unrelated.stop()


def test_ci_run_cleans_up_its_leftovers_only(tmp_path):
    """.ci/run itself around a stand-in test command that leaves a qcluster running in its own
    session (as a crashed test would): on exit the run's clean-up stops it; a qcluster that was
    running before, outside the run, is untouched."""
    unrelated = start_qcluster(tmp_path)
    pidfile = tmp_path / "left-behind.pid"
    leave = (
        f"{sys.executable} -c \"import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, 'manage.py', 'qcluster'], start_new_session=True, "
        f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        f"open('{pidfile}', 'w').write(str(p.pid))\" && sleep 5"
    )
    env = child_env(BROKER_CI_TEST_COMMAND=leave)
    env.pop("BROKER_CI_RUN", None)
    try:
        assert wait_for(lambda: len(group_pids(unrelated.pid)) >= 3)
        result = subprocess.run(["bash", str(ROOT / ".ci" / "run")], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        left = int(pidfile.read_text())
        assert "left by this run" in result.stderr, result.stderr[-2000:]
        assert wait_for(lambda: not alive(left) and not group_pids(left), timeout=15), "the run's qcluster was stopped"
        assert unrelated.popen.poll() is None and len(group_pids(unrelated.pid)) >= 3, "the other one runs on"
    finally:
        unrelated.stop()
