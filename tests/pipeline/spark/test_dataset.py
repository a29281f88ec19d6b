"""Reports over any window (issue 30) on a real local Spark over the test PostgreSQL: the facts,
the archive and the live database as one dataset; report, archive, retention, report again equal
figure for figure (and again with --rebuild, from the archive); each finished day's facts written
once, later runs reading only the days not finished over JDBC; one writer at a time; a crash while
committing loses nothing. (A day that lost rows to retention, reported incomplete: test_cluster.)"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from jobs.models import Job
from jobs.sweeps.retention import retention_run
from pipeline import facts as facts_module
from pipeline.archive import messages_archive
from pipeline.dataset import dataset_read, retention_ledger
from pipeline.facts import FactsStore
from pipeline.report import pipeline_report_build
from tests.jobs.moves import job_move
from tests.pipeline.spark.workload import assert_same_figures, history

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

QUEUED, INFLIGHT, DELIVERED = 1001, 1002, 1003


def report(spark, tmp_path, name: str, since, until, **kwargs) -> dict:
    out = tmp_path / name
    pipeline_report_build(spark=spark, since=since, until=until, out_dir=out, record_latest=False, **kwargs)
    return json.loads((out / "report.json").read_text())


def live_jobs_since(moment: datetime) -> int:
    return Job.objects.filter(message__received_at__gte=moment).count()


def midnight(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def unfinished_since(figures: dict) -> datetime:
    """The start of the oldest day a report could not write facts for (today, or yesterday too
    within minutes of midnight)."""
    return datetime.fromisoformat(min(d["day"] for d in figures["days"] if not d["finished"]) + "T00:00+00:00")


def test_report_archive_retention_report_again_equal(spark, tmp_path, pipeline_dir, settings):
    settings.BROKER_RETENTION = timedelta(days=2)
    settings.BROKER_DEAD_RETENTION = timedelta(days=20)
    now = datetime.now(timezone.utc)
    builder, (ch0, ch1) = history(tag="e", days=5, per_channel=20, now=now)
    # a message the archive skips (a job still QUEUED), whose job finishes afterwards: retention
    # then removes it, with no archived copy
    late_at = now - timedelta(days=3, hours=12)
    late = builder.message(channel=ch0, received_at=late_at, fates={"e-c00": "delivered", "e-c01": "queued"})
    late_day = late_at.date().isoformat()
    since, until = now - timedelta(days=6), now  # longer than the retention (2 days)

    first = report(spark, tmp_path, "r1", since, until)
    assert first["jobs"] == 82 and first["complete"]
    written = [d for d in first["days"] if d["facts_written"]]
    assert len(written) >= 5 and first["jdbc_rows"]["jobs"] == live_jobs_since(midnight(since))
    store = FactsStore()
    markers = store.markers()
    assert sorted(markers) == sorted(d["day"] for d in written)
    for marker in markers.values():  # partitioned by day and channel, in the schema's folder
        assert all(rel.startswith(f"jobs/day={marker.day}/channel=e-ch") for rel in marker.files["jobs"])
    stamps = {day: (store.base / "days" / f"{day}.json").stat().st_mtime_ns for day in markers}

    archived = messages_archive(spark=spark, out_dir=pipeline_dir / "archive", older_than="1d", dead_older_than="20d")
    assert archived.pruned["jobs"] > 10
    job = Job.objects.get(message=late, status=QUEUED)
    job_move(job_id=job.pk, from_status=QUEUED, to_status=INFLIGHT, reason="claim", timeout=30)
    job_move(job_id=job.pk, from_status=INFLIGHT, to_status=DELIVERED, reason="ack")
    while retention_run(budget=30, sweep_every=0).removed.rows:
        pass
    assert not Job.objects.filter(message=late).exists()
    assert retention_ledger() == {late_day: {"e-ch0": 2}}
    for i in range(3):  # new messages after the window's end: read over JDBC (today), not counted
        builder.message(channel=ch1, received_at=now + timedelta(seconds=i))

    # from the facts: equal; only the days not finished read again over JDBC; no facts rewritten
    second = report(spark, tmp_path, "r2", since, until)
    assert_same_figures(second, first)
    assert second["complete"] and second["facts"]["days_written"] == []
    assert second["jdbc_rows"]["jobs"] == live_jobs_since(unfinished_since(first)) < first["jdbc_rows"]["jobs"]
    assert {day: (store.base / "days" / f"{day}.json").stat().st_mtime_ns for day in markers} == stamps

    # --rebuild: every day read again, from the archive and the database: still equal; the day
    # retention took from keeps its (complete) facts and says so; the others get a new generation
    third = report(spark, tmp_path, "r3", since, until, rebuild=True)
    assert_same_figures(third, first)
    days = {d["day"]: d for d in third["days"]}
    assert days[late_day]["source"] == "facts" and "kept its facts" in days[late_day]["note"]
    assert 0 < sum(d["archived_jobs"] for d in third["days"] if d["facts_written"]) <= archived.pruned["jobs"]
    assert third["complete"]
    rebuilt = store.markers()
    assert rebuilt[late_day].generation == markers[late_day].generation
    assert all(m.generation != markers[d].generation for d, m in rebuilt.items() if d != late_day)
    retired = json.loads((store.base / "retired.json").read_text())  # readable for an hour more
    assert retired and all((store.base / rel).exists() for entry in retired for rel in entry["files"])

    # (without those facts the day is reported incomplete: test_cluster.py)


def test_one_writer_at_a_time_and_a_crash_while_committing_loses_nothing(spark, tmp_path, pipeline_dir,
                                                                         monkeypatch):
    now = datetime.now(timezone.utc)
    history(tag="w", days=4, per_channel=10, now=now)
    since = now - timedelta(days=5)
    store = FactsStore()

    renames = {"n": 0}
    real_rename = facts_module.os.rename

    def crash_on_fifth(src, dest):
        renames["n"] += 1
        if renames["n"] == 5:
            raise OSError("disk gone")
        return real_rename(src, dest)

    monkeypatch.setattr(facts_module.os, "rename", crash_on_fifth)
    with pytest.raises(OSError, match="disk gone"):
        report(spark, tmp_path, "crash", since, now)
    monkeypatch.undo()
    committed = store.markers()
    crashed_day = sorted(d.name[4:] for d in (store.base / "jobs").iterdir() if d.name[4:] not in committed)
    assert crashed_day  # its first files were moved in, its marker never written

    said, done, days = [], threading.Event(), []

    def run():  # a second writer: reads and commits what the crashed run could not
        try:
            with dataset_read(spark=spark, since=since, until=now, write=True, say=said.append) as dataset:
                days.extend(dataset.days)
        finally:
            connection.close()
            done.set()

    with store.locked():  # another writer holds the facts
        worker = threading.Thread(target=run)
        worker.start()
        assert not done.wait(3)
        assert any("waiting for another run writing facts" in m for m in said)
    worker.join(120)
    assert done.is_set() and days
    written = {d.day: d for d in days if d.written}
    assert crashed_day[0] in written and not set(written) & set(committed)
    marker = store.markers()[crashed_day[0]]
    on_disk = sorted(str(p.relative_to(store.base)) for t in ("jobs", "attempts", "transitions")
                     for p in (store.base / t / f"day={crashed_day[0]}").glob("channel=*/*.parquet"))
    assert on_disk == sorted(rel for files in marker.files.values() for rel in files)  # leftovers gone
    with dataset_read(spark=spark, since=since, until=now) as dataset:  # a reader: the facts, and JDBC for the rest
        assert dataset.in_window(dataset.jobs).count() == Job.objects.filter(message__received_at__gte=since).count()
        assert dataset.jdbc_rows["jobs"] == sum(d.jobs for d in days if not d.finished) < Job.objects.count()
        assert not (store.base / "_work").exists() or [p.name for p in (store.base / "_work").iterdir()] == [
            dataset.work.name]
