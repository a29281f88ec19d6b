"""Archive-and-prune on a real local Spark over the test PostgreSQL: archive, prune, verify;
crashes at every step followed by a re-run; no secrets in the output."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone as dj_timezone

from broker.models import Channel, Message
from jobs.models import DeliveryAttempt, Job, JobTransition
from pipeline import archive as archive_module
from pipeline import prune as prune_module
from pipeline.readers import SECRET_COLUMNS
from tests.pipeline.spark.workload import SECRET_MARK, Builder, world_create

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

TABLES = ("messages", "jobs", "transitions", "attempts")
ALL_DELIVERED = {"a-c00": "delivered", "a-c01": "delivered", "a-c10": "delivered", "a-c11": "delivered"}


def scenario() -> dict:
    """Messages that must be archived (``eligible``) and ones that must stay, by reason."""
    # noon UTC today: the hour offsets below then never cross a UTC midnight, so the number of
    # day partitions does not depend on when the suite runs (it failed once at 00:06 UTC)
    now = dj_timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    world = world_create(tag="a")
    b = Builder(world, seed=11)
    ch0, ch1 = world.channels
    eligible, kept = [], {}
    for channel in (ch0, ch1):
        for i in range(5):  # old, every job delivered (two UTC days)
            eligible.append(b.message(channel=channel, received_at=now - timedelta(days=40 + i % 2, hours=i),
                                      fates=ALL_DELIVERED).pk)
    # very old, one job dead for longer than the dead retention (90 days)
    eligible.append(b.message(channel=ch0, received_at=now - timedelta(days=120),
                              fates={"a-c00": "delivered", "a-c01": "dead"}, dead_at=now - timedelta(days=100)).pk)
    # old and dispatched to a channel without consumers: nothing will ever happen to it
    lonely = Channel.objects.create(channel_id="a-lonely", name="L", token=f"{SECRET_MARK}-lonely", updated_at=now)
    eligible.append(b.message(channel=lonely, received_at=now - timedelta(days=45)).pk)
    kept["pending job"] = b.message(channel=ch0, received_at=now - timedelta(days=40),
                                    fates={"a-c00": "delivered", "a-c01": "queued"}).pk
    kept["recently dead"] = b.message(channel=ch1, received_at=now - timedelta(days=40),
                                      fates={"a-c10": "delivered", "a-c11": "dead"},
                                      dead_at=now - timedelta(days=35)).pk
    kept["young"] = b.message(channel=ch1, received_at=now - timedelta(days=5), fates=ALL_DELIVERED).pk
    kept["not dispatched"] = b.message(channel=lonely, received_at=now - timedelta(days=45), status=101).pk
    return {"eligible": sorted(eligible), "kept": kept, "rows": db_rows(eligible), "kept_rows": db_rows(kept.values())}


def db_rows(message_ids) -> dict[str, list[int]]:
    message_ids = list(message_ids)
    job_ids = list(Job.objects.filter(message_id__in=message_ids).values_list("id", flat=True))
    return {
        "messages": sorted(Message.objects.filter(id__in=message_ids).values_list("id", flat=True)),
        "jobs": sorted(job_ids),
        "transitions": sorted(JobTransition.objects.filter(job_id__in=job_ids).values_list("id", flat=True)),
        "attempts": sorted(DeliveryAttempt.objects.filter(job_id__in=job_ids).values_list("id", flat=True)),
    }


def archived_ids(spark, out: Path, table: str) -> list[int]:
    path = out / table
    if not path.exists():
        return []
    return sorted(r["id"] for r in spark.read.parquet(str(path)).select("id").collect())


def assert_archived_once(spark, out: Path, world: dict) -> None:
    """Rows gone from PostgreSQL, present exactly once in Parquet; the others untouched."""
    for table in TABLES:
        assert archived_ids(spark, out, table) == world["rows"][table], table
    assert db_rows(world["eligible"]) == {t: [] for t in TABLES}
    assert db_rows(world["kept"].values()) == world["kept_rows"]


def run(spark, out: Path, **kwargs):
    return archive_module.messages_archive(spark=spark, out_dir=out, older_than="30d", batch_size=3, **kwargs)


def test_archive_then_prune_then_verify(spark, tmp_path, capsys):
    from pyspark.sql import functions as F

    world = scenario()
    assert len(world["eligible"]) == 12 and len(world["rows"]["transitions"]) > 40
    payloads = {m.pk: bytes(m.payload) for m in Message.objects.filter(pk__in=world["eligible"])}
    out = tmp_path / "archive"

    call_command("pipeline", "archive", "--older-than", "30d", "--out", str(out), "--batch-size", "5")
    printed = capsys.readouterr().out
    assert "[pipeline] verified messages: 12 rows" in printed
    assert "deleted 12 messages" in printed

    assert_archived_once(spark, out, world)
    # partitioned by channel and day; each message's rows share its partition
    assert sorted(p.name for p in (out / "messages").iterdir()) == ["channel=a-ch0", "channel=a-ch1", "channel=a-lonely"]
    assert len(list((out / "messages" / "channel=a-ch0").glob("day=*/*.parquet"))) == 3
    messages = spark.read.parquet(str(out / "messages"))
    assert {r["id"]: bytes(r["payload"]) for r in messages.select("id", "payload").collect()} == payloads
    jobs = spark.read.parquet(str(out / "jobs"))
    joined = jobs.join(messages.select(F.col("id").alias("message_id"), F.col("channel").alias("mc"),
                                       F.col("day").alias("md")), "message_id")
    assert joined.where((F.col("channel") != F.col("mc")) | (F.col("day") != F.col("md"))).count() == 0
    assert jobs.where(F.col("status") == 1004).count() == 1

    # never a token or a secret (columns, values, credential headers)
    for table in TABLES:
        frame = spark.read.parquet(str(out / table))
        assert not set(frame.columns) & SECRET_COLUMNS
        text = frame.select(F.concat_ws("|", *[F.col(c).cast("string") for c in frame.columns]).alias("v"))
        assert text.where(F.col("v").contains(SECRET_MARK)).count() == 0, table
    headers = messages.where(F.col("channel") == "a-ch0").first()["headers"]
    assert "X-Trace" in headers and "Authorization" not in headers

    runs = list((out / "_runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "PRUNED").exists() and not (runs[0] / "staging").exists()

    # a re-run finds nothing new and duplicates nothing
    result = run(spark, out)
    assert result.run_id is None and result.exported == {}
    assert_archived_once(spark, out, world)

    # a shorter dead retention makes the recently dead message eligible too
    result = run(spark, out, dead_older_than="30d")
    assert result.exported["messages"] == 1 and result.pruned["messages"] == 1
    assert archived_ids(spark, out, "messages") == sorted(world["eligible"] + [world["kept"]["recently dead"]])
    assert Message.objects.filter(pk=world["kept"]["pending job"]).exists()


class Crash(Exception):
    pass


@pytest.mark.parametrize("where", ["before_verify", "mid_publish", "before_prune", "mid_prune"])
def test_crash_then_rerun_loses_nothing_and_duplicates_nothing(spark, tmp_path, monkeypatch, where):
    world = scenario()
    out = tmp_path / "archive"
    real_prune, real_rename = prune_module.messages_prune, archive_module.os.rename
    calls = {"n": 0}

    def crash_on(call: int, real):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == call:
                raise Crash(where)
            return real(*args, **kwargs)
        return wrapper

    if where == "before_verify":
        monkeypatch.setattr(archive_module, "archive_verify", crash_on(1, archive_module.archive_verify))
    elif where == "mid_publish":
        monkeypatch.setattr(archive_module.os, "rename", crash_on(5, real_rename))
    elif where == "before_prune":
        monkeypatch.setattr(prune_module, "messages_prune", crash_on(1, real_prune))
    else:
        monkeypatch.setattr(prune_module, "messages_prune", crash_on(3, real_prune))  # 2 batches done

    with pytest.raises(Crash):
        run(spark, out)
    monkeypatch.undo()

    still_there = db_rows(world["eligible"])
    if where == "mid_prune":
        assert len(still_there["messages"]) == len(world["eligible"]) - 6
    else:  # nothing deleted before the crash
        assert still_there == world["rows"]
    assert db_rows(world["kept"].values()) == world["kept_rows"]

    result = run(spark, out)
    assert len(result.recovered) == 1
    assert_archived_once(spark, out, world)
    assert all((r / "PRUNED").exists() for r in (out / "_runs").iterdir())


def test_a_message_changed_after_export_stays_in_postgres(spark, tmp_path, monkeypatch):
    world = scenario()
    out = tmp_path / "archive"
    victim = world["eligible"][0]
    real_prune = prune_module.messages_prune

    def requeue_then_prune(*, expected):
        job = Job.objects.filter(message_id=victim).first()
        JobTransition.objects.create(job_id=job.pk, from_status=1003, to_status=1001, reason="test",
                                     at=datetime.now(timezone.utc))
        return real_prune(expected=expected)

    monkeypatch.setattr(prune_module, "messages_prune", requeue_then_prune)
    result = run(spark, out)
    assert result.changed == [victim]
    assert Message.objects.filter(pk=victim).exists()
    assert result.pruned["messages"] == len(world["eligible"]) - 1


def test_an_archive_that_does_not_read_back_complete_deletes_nothing(spark, tmp_path, monkeypatch):
    world = scenario()
    out = tmp_path / "archive"
    real_export = archive_module.archive_export

    def export_then_lose_a_file(**kwargs):
        sources = real_export(**kwargs)
        staged = out / "_runs" / kwargs["run_id"] / "staging" / "transitions"
        next(staged.rglob("*.parquet")).unlink()
        return sources

    monkeypatch.setattr(archive_module, "archive_export", export_then_lose_a_file)
    with pytest.raises(archive_module.ArchiveVerificationError, match="transitions: source"):
        run(spark, out)
    monkeypatch.undo()
    assert db_rows(world["eligible"]) == world["rows"]
    assert not (out / "messages").exists()

    run(spark, out)
    assert_archived_once(spark, out, world)
