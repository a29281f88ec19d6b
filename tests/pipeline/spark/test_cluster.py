"""The same report on a standalone Spark cluster: one master and one worker on loopback, started
with the pyspark package's own ``bin/spark-class`` (its Master and Worker, small memory:
tests/pipeline/spark/cluster.py, started with the session's Spark), and ``manage.py pipeline
report --master spark://...`` run against the test database; it must give the report a local
Spark gives, figure for figure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from jobs.sweeps.retention import retention_run
from pipeline.dataset import retention_ledger
from pipeline.facts import FactsStore
from pipeline.report import pipeline_report_build
from tests.pipeline.spark.workload import assert_same_figures, history
from tests.processes import ROOT, child_env

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_standalone_cluster_gives_the_local_report(spark, tmp_path, pipeline_dir, settings, standalone_cluster):
    """Also: a day that lost rows to retention (no archive) is reported incomplete, on both."""
    settings.BROKER_RETENTION = timedelta(days=2)
    now = datetime.now(timezone.utc)
    builder, (ch0, _ch1) = history(tag="k", days=3, per_channel=12, now=now)
    gone_at = now - timedelta(days=2, hours=12)
    gone_day = gone_at.date().isoformat()
    builder.message(channel=ch0, received_at=gone_at, fates={"k-c00": "delivered", "k-c01": "delivered"})
    while retention_run(budget=30, sweep_every=0).removed.rows:  # every finished message past 2 days
        pass
    lost = [{"day": day, "channel": channel, "missing_jobs": n}
            for day, by_channel in sorted(retention_ledger().items()) for channel, n in sorted(by_channel.items())]
    missing = sum(d["missing_jobs"] for d in lost)
    assert gone_day in {d["day"] for d in lost} and missing >= 2
    since, until = (now - timedelta(days=4)).isoformat(), now.isoformat()
    out = tmp_path / "cluster"
    env = child_env(BROKER_PIPELINE_DIR=tmp_path / "cluster-pipeline", BROKER_SPARK_DRIVER_MEMORY="512m",
                    BROKER_LOG_LEVEL="WARNING")
    log = tmp_path / "cluster-run.log"
    with open(log, "wb") as fh:
        cluster_run = subprocess.Popen(  # its start-up overlaps the local report
            [sys.executable, "manage.py", "pipeline", "report", "--master", standalone_cluster, "--since", since,
             "--until", until, "--out", str(out)], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True)
    local = tmp_path / "local"
    try:
        pipeline_report_build(spark=spark, since=datetime.fromisoformat(since), until=now, out_dir=local,
                              record_latest=False)
        cluster_run.wait(timeout=240)
    finally:
        if cluster_run.poll() is None:
            os.killpg(cluster_run.pid, signal.SIGKILL)
            cluster_run.wait()
    stdout = log.read_text(errors="replace")
    assert cluster_run.returncode == 0, stdout[-5000:]
    assert f"on {standalone_cluster} ready" in stdout
    assert f"incomplete: {len(lost)} day(s) lack {missing} jobs" in stdout

    want = json.loads((local / "report.json").read_text())
    got = json.loads((out / "report.json").read_text())
    assert got["jobs"] == want["jobs"] == 50 - missing
    assert_same_figures(got, want)
    assert got["incomplete_days"] == want["incomplete_days"] == lost
    assert "Incomplete data" in (out / "report.html").read_text()
    assert [(d["day"], d["jobs"], d["facts_written"], d["missing_jobs"]) for d in got["days"]] == [
        (d["day"], d["jobs"], d["facts_written"], d["missing_jobs"]) for d in want["days"]]
    # the executors wrote the facts where the driver's BROKER_PIPELINE_DIR says; they remember the loss
    facts = FactsStore(tmp_path / "cluster-pipeline" / "facts")
    assert facts.markers()[gone_day].missing == retention_ledger()[gone_day]
    assert facts.files(facts.markers().values(), "jobs")
