"""``BROKER_PIPELINE_DATABASE_URL``: the pipeline reads a real streaming standby and writes only to
the primary. The standby is made from the test session's own PostgreSQL (``pg_basebackup`` with
its binaries, hot standby on loopback, ``hot_standby_feedback`` off as docs/high-availability.md
advises); its replay is paused, so the primary moves on without it: the report must show the
standby's view, the primary must see no pipeline read (no JDBC session, not one scan of the
broker's tables), and the archive, reading the standby's stale view, must keep on the primary the
message whose job was requeued there meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from bench.pipeline import SnapshotWatch
from broker.db.urls import database_url_render
from broker.embedded_db import DB_USER, _bin_dir, _run_as
from broker.models import Message
from jobs.models import Job
from tests.jobs.moves import job_move
from tests.pipeline.spark.workload import DELIVERED, QUEUED, Builder, workload_report
from tests.processes import ROOT, child_env, free_port, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

TABLES = ("broker_message", "jobs_job", "jobs_jobtransition", "jobs_deliveryattempt")
SCANS = ("SELECT relname, COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_user_tables "
         "WHERE relname = ANY(%s)")


class Standby:
    """A hot standby of the server at 127.0.0.1:``primary_port``, streaming, under a throw-away folder."""

    def __init__(self, primary_port: int):
        self.base = Path(tempfile.mkdtemp(prefix="broker-pipeline-standby-"))
        self.pgdata, self.port = self.base / "pgdata", free_port()
        run_as = _run_as()
        self.base.chmod(0o755)
        if run_as:
            shutil.chown(self.base, run_as["user"], run_as["group"])
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", primary_port, "-U", DB_USER, "-D", self.pgdata,
                  "-R", "-X", "stream", "-c", "fast")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} -c max_connections=300 "
                   "-c shared_buffers=32MB -c fsync=off -c hot_standby=on -c hot_standby_feedback=off")
        self._run("pg_ctl", "-D", self.pgdata, "-w", "-t", "60", "-l", self.base / "server.log", "-o", options,
                  "start")

    @staticmethod
    def _run(*args) -> None:
        subprocess.run([str(_bin_dir() / args[0]), *map(str, args[1:])], check=True, capture_output=True,
                       timeout=180, **_run_as())

    def conninfo(self) -> dict:
        return {**SnapshotWatch.conninfo(), "host": "127.0.0.1", "port": self.port}

    def sql(self, statement: str, params=None) -> list:
        with psycopg.connect(**self.conninfo(), autocommit=True) as conn:
            return conn.execute(statement, params).fetchall()

    def catch_up(self) -> None:
        """Wait until the standby replayed everything the primary has written so far (the insert
        position: the test server commits without waiting for the WAL flush, so the last commits may
        not have reached the write position yet)."""
        with connection.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            target = cur.fetchone()[0]
        assert wait_for(lambda: self.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target])[0][0], 60)

    def stop(self) -> None:
        subprocess.run([str(_bin_dir() / "pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60, **_run_as())
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def standby():
    sd = connection.settings_dict
    if sd["HOST"] not in ("127.0.0.1", "localhost") or not (_bin_dir() / "pg_basebackup").exists():
        # a standby is a pg_basebackup of the session's server: only a local server of ours can give
        # one (DATABASE_URL pointing elsewhere cannot); CI always runs on the local embedded server
        if os.environ.get("CI"):
            pytest.fail("CI runs the replica test: the session's PostgreSQL must be local with pg_basebackup")
        pytest.skip("the standby is made from the test session's local embedded PostgreSQL "
                    f"(this session's is {sd['HOST']}, pg_basebackup in {_bin_dir()})")
    server = Standby(int(sd["PORT"]))
    yield server
    server.stop()


def scans(info: dict) -> dict[str, int]:
    """Sequential and index scans of the broker's big tables on a server so far."""
    with psycopg.connect(**info, autocommit=True) as conn:
        return dict(conn.execute(SCANS, [list(TABLES)]).fetchall())


def pipeline(env: dict, *args: str) -> str:
    proc = subprocess.run([sys.executable, "manage.py", "pipeline", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_pipeline_reads_the_replica_and_writes_only_the_primary(standby, tmp_path):
    now = datetime.now(timezone.utc)
    world = workload_report(now=now, messages_per_channel=30, out_of_scope=5, tag="rp")  # 120 jobs in 60 h
    old = [m for m in world.messages if m.received_at < now - timedelta(days=10)]
    requeued = next(m for m in old if Job.objects.filter(message=m).exclude(status=DELIVERED).count() == 0)
    standby.catch_up()
    standby.sql("SELECT pg_wal_replay_pause()")
    # on the primary only, from now on: new messages, and a job of an archivable message requeued
    builder = Builder(world, seed=3)
    builder.n = 1000
    for channel in world.channels:
        builder.message(channel=channel, received_at=now - timedelta(hours=1))
    job = Job.objects.filter(message=requeued).first()
    job_move(job_id=job.pk, from_status=DELIVERED, to_status=QUEUED, reason="requeue")

    primary_info = SnapshotWatch.conninfo()
    replica_url = database_url_render({**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(standby.port)})
    env = child_env(BROKER_PIPELINE_DATABASE_URL=replica_url, BROKER_PIPELINE_DIR=tmp_path / "pipeline",
                    BROKER_PIPELINE_CHUNK_ROWS="25", SPARK_MASTER="local[1]", BROKER_SPARK_DRIVER_MEMORY="1g",
                    BROKER_LOG_LEVEL="WARNING")
    with connection.cursor() as cur:  # this test's own scans so far, counted before the run, not in it
        cur.execute("SELECT pg_stat_force_next_flush()")
    # and any other session's: an idle one flushes its statistics within 10 s (PostgreSQL's
    # PGSTAT_IDLE_INTERVAL): under the parallel suite the primary once counted one read of
    # broker_message inside the run, most likely a connection an earlier test of the worker left idle
    time.sleep(11)
    on_primary, on_replica = SnapshotWatch(primary_info), SnapshotWatch(standby.conninfo(), tick=False)
    before = scans(primary_info), scans(standby.conninfo())
    since = now - timedelta(days=3)
    pipeline(env, "report", "--since", since.isoformat(), "--until", now.isoformat(), "--out", str(tmp_path / "r"))
    time.sleep(0.5)  # the children's statistics are sent as they exit
    after = scans(primary_info), scans(standby.conninfo())
    primary_seen, replica_seen = on_primary.stop(), on_replica.stop()

    figures = json.loads((tmp_path / "r" / "report.json").read_text())
    in_window = Job.objects.filter(message__received_at__gte=since, message__received_at__lt=now)
    assert figures["jobs"] == 120 and in_window.count() == 124  # the standby's view: not the 4 jobs after the pause
    assert "broker-pipeline" in on_replica.applications and replica_seen["samples"] > 0
    assert "broker-pipeline" not in on_primary.applications and primary_seen["samples"] > 0
    assert after[0] == before[0], ("the primary saw reads of the broker's tables", before[0], after[0])
    assert sum(after[1].values()) > sum(before[1].values())

    # the archive reads the standby (where the requeued message still looks finished) and prunes on
    # the primary, which checks what it deletes: that message stays
    eligible = [m.pk for m in old if m.pk != requeued.pk and
                not Job.objects.filter(message=m).exclude(status=DELIVERED).exists()]
    on_primary, on_replica = SnapshotWatch(primary_info), SnapshotWatch(standby.conninfo(), tick=False)
    output = pipeline(env, "archive", "--older-than", "10d", "--dead-older-than", "3650d", "--out",
                      str(tmp_path / "archive"))
    on_primary.stop(), on_replica.stop()
    assert "1 messages changed since export" in output, output
    assert Message.objects.filter(pk=requeued.pk).exists()
    assert eligible and not Message.objects.filter(pk__in=eligible).exists()
    assert "broker-pipeline" in on_replica.applications and "broker-pipeline" not in on_primary.applications
