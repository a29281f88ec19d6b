"""Archive-and-prune: finished, old messages move from PostgreSQL to Parquet with their history.

Eligible: messages received before ``now - older_than`` whose jobs are all DELIVERED, or DEAD
since before ``now - dead_older_than`` (``BROKER_DEAD_RETENTION``, default 90 days); a message
without jobs only once dispatched. Each is written with its jobs, job transitions and delivery
attempts to ``DIR/{messages,jobs,transitions,attempts}/channel=<channel id>/day=YYYY-MM-DD/``
(UTC day of publication, so all rows of one message share a partition). Tokens, signing secrets
and callback URLs are never read; credential-looking message headers are dropped.

How a crash loses nothing and a re-run finishes without duplicates. Each run has an id and a
folder ``DIR/_runs/<run>/``, and moves through states recorded by marker files, in this order:

1. export: Spark reads the eligible rows over JDBC, in chunks of short transactions, from the
   primary or the pipeline's replica (skipping message ids already in the archive) and writes them to ``_runs/<run>/staging/`` (not yet part of the archive);
2. verify: the staged Parquet is read back; per table its row count and its set of ids must
   equal the source's, without duplicates. The per-message row counts are saved
   (``expected/``) and ``VERIFIED`` is written;
3. publish: every staged file is renamed into the archive folders as ``<run>-<name>.parquet``
   (a rename is atomic and happens once per file), then ``PUBLISHED`` is written;
4. prune: in batches of ``batch_size`` messages, one transaction each, rows are deleted from
   the primary only if they still match the archived counts and every job, archived and current,
   is DELIVERED or DEAD (``pipeline.prune``); then ``PRUNED``.

Nothing is deleted from PostgreSQL before its rows are verified and published, so a crash
before step 4 leaves every row in the database; a crash during step 4 leaves each batch either
deleted (and archived) or not. Every run starts by finishing earlier runs: a run without
``VERIFIED`` is discarded (its rows are still in PostgreSQL and will be exported again), a
verified one is published and pruned (already deleted messages are skipped). Exports skip ids
already archived, so a message is in the archive once. Re-run with the same ``--out``.
A message that changed between export and prune (e.g. an operator requeued a dead job) stays in
PostgreSQL and is reported; its archived copy stays too and it is not exported again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

from django.conf import settings

from jobs.models import JobStatus
from pipeline import prune as prune_module
from pipeline.queries import Q
from pipeline.readers import jdbc_read
from pipeline.timeparse import duration_parse

TABLES = ("messages", "jobs", "transitions", "attempts")
RUNS = "_runs"
VERIFIED, PUBLISHED, PRUNED = "VERIFIED", "PUBLISHED", "PRUNED"
DELIVERED, DEAD = JobStatus.DELIVERED.value, JobStatus.DEAD.value
DISPATCHED = 102


class ArchiveVerificationError(RuntimeError):
    """The Parquet read back does not match the source: nothing is deleted."""


class ArchiveBusy(RuntimeError):
    pass


@dataclass
class ArchiveResult:
    out_dir: Path
    run_id: str | None = None
    exported: dict = field(default_factory=dict)
    pruned: dict = field(default_factory=dict)
    changed: list = field(default_factory=list)
    recovered: list = field(default_factory=list)
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)


def _source_frames(*, spark, cutoff: datetime, dead_cutoff: datetime) -> dict:
    """The four tables' rows for archiving (messages filtered by eligibility; the others by the
    cheap superset ``received_at < cutoff`` and then semi-joined to the messages in Spark)."""
    eligible = {"cutoff": cutoff, "dead_cutoff": dead_cutoff, "dispatched": DISPATCHED,
                "delivered": DELIVERED, "dead": DEAD}
    old = {"cutoff": cutoff}
    return {
        "messages": jdbc_read(spark=spark, query=Q.archive_messages_read, params=eligible,
                              bounds_table="broker_message"),
        "jobs": jdbc_read(spark=spark, query=Q.archive_jobs_read, params=old, bounds_table="jobs_job"),
        "transitions": jdbc_read(spark=spark, query=Q.archive_transitions_read, params=old,
                                 bounds_table="jobs_jobtransition"),
        "attempts": jdbc_read(spark=spark, query=Q.archive_attempts_read, params=old,
                              bounds_table="jobs_deliveryattempt"),
    }


def _archived_ids(spark, out: Path):
    path = out / "messages"
    if not path.is_dir() or not any(path.rglob("*.parquet")):
        return None
    return spark.read.parquet(str(path)).select("id")


def _mark(run_dir: Path, name: str, data: dict | None = None) -> None:
    """Write a state marker durably (file and folder fsynced) before moving on."""
    path = run_dir / name
    tmp = run_dir / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data or {}, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def archive_export(*, spark, out: Path, run_id: str, cutoff: datetime, dead_cutoff: datetime,
                   say: Callable[[str], None]) -> dict:
    """Step 1: write the eligible, not yet archived rows to the run's staging folder.
    Returns the persisted source frames (empty when there is nothing to archive)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    frames = _source_frames(spark=spark, cutoff=cutoff, dead_cutoff=dead_cutoff)
    messages = frames["messages"]
    archived = _archived_ids(spark, out)
    if archived is not None:
        messages = messages.join(archived, "id", "left_anti")
    messages = messages.persist(StorageLevel.MEMORY_AND_DISK)
    if messages.count() == 0:
        messages.unpersist()
        return {}
    ids = messages.select(F.col("id").alias("message_id"))
    sources = {"messages": messages}
    for table in TABLES[1:]:
        sources[table] = frames[table].join(ids, "message_id", "left_semi").persist(StorageLevel.MEMORY_AND_DISK)
    stage = out / RUNS / run_id / "staging"
    for table, frame in sources.items():
        say(f"exporting {table}")
        (frame.repartition("channel", "day").write.mode("error").partitionBy("channel", "day")
         .parquet(str(stage / table)))
    return sources


def archive_verify(*, spark, out: Path, run_id: str, sources: dict, say: Callable[[str], None]) -> dict:
    """Step 2: read the staged Parquet back and check counts and ids against the source."""
    from pyspark.sql import functions as F

    run_dir = out / RUNS / run_id
    stage = run_dir / "staging"
    counts, staged = {}, {}
    for table, source in sources.items():
        frame = spark.read.parquet(str(stage / table))
        # One pass: every id must appear exactly once on each side (same count, same ids, no duplicates).
        sides = (source.select("id", F.lit(1).alias("s"), F.lit(0).alias("t"))
                 .unionByName(frame.select("id", F.lit(0).alias("s"), F.lit(1).alias("t")))
                 .groupBy("id").agg(F.sum("s").alias("s"), F.sum("t").alias("t")))
        check = sides.agg(F.sum("s").alias("source"), F.sum("t").alias("archive"),
                          F.sum(F.when((F.col("s") != 1) | (F.col("t") != 1), 1).otherwise(0)).alias("bad")).first()
        n_source, n_staged, bad = (int(check[k] or 0) for k in ("source", "archive", "bad"))
        if n_source != n_staged or bad:
            raise ArchiveVerificationError(
                f"{table}: source {n_source} rows, archive {n_staged} rows, {bad} ids missing, extra or "
                "duplicated; nothing was deleted")
        counts[table] = n_staged
        staged[table] = frame
        say(f"verified {table}: {n_staged} rows")
    per_message = staged["messages"].select("id")
    for table, name in (("jobs", "nj"), ("transitions", "nt"), ("attempts", "na")):
        grouped = staged[table].groupBy(F.col("message_id").alias("id")).agg(F.count(F.lit(1)).alias(name))
        per_message = per_message.join(grouped, "id", "left")
    # the archived jobs that are finished: the tables are read at different moments (chunks, a
    # replica), so a job requeued between the messages' read and the jobs' is archived unfinished
    finished = (staged["jobs"].where(F.col("status").isin(DELIVERED, DEAD))
                .groupBy(F.col("message_id").alias("id")).agg(F.count(F.lit(1)).alias("nf")))
    per_message = per_message.join(finished, "id", "left")
    per_message = per_message.fillna(0)
    per_message.coalesce(1).write.mode("overwrite").parquet(str(run_dir / "expected"))
    for source in sources.values():
        source.unpersist()
    _mark(run_dir, VERIFIED, {"counts": counts})
    return counts


def archive_publish(*, out: Path, run_id: str) -> int:
    """Step 3: move the staged files into the archive (idempotent: moved files are gone from
    staging, so a re-run moves only the rest)."""
    run_dir = out / RUNS / run_id
    stage = run_dir / "staging"
    moved = 0
    if stage.is_dir():
        for table in TABLES:
            base = stage / table
            for src in sorted(base.rglob("*.parquet")) if base.is_dir() else []:
                if src.name.startswith((".", "_")):
                    continue
                dest = out / table / src.parent.relative_to(base) / f"{run_id}-{src.name}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dest)
                moved += 1
    _mark(run_dir, PUBLISHED, {"files": moved})
    shutil.rmtree(stage, ignore_errors=True)
    return moved


def archive_prune(*, spark, out: Path, run_id: str, batch_size: int,
                  say: Callable[[str], None]) -> prune_module.PruneCounts:
    """Step 4: delete the run's messages from PostgreSQL in batches, where unchanged."""
    run_dir = out / RUNS / run_id
    expected = spark.read.parquet(str(run_dir / "expected"))
    finished = "nf" if "nf" in expected.columns else "nj"  # a run of an earlier version: its counts only
    rows = [(r["id"], r["nj"], r["nt"], r["na"], r[finished]) for r in expected.orderBy("id").collect()]
    total = prune_module.PruneCounts()
    started = time.monotonic()
    for start in range(0, len(rows), batch_size):
        total.add(prune_module.messages_prune(expected=rows[start:start + batch_size]))
        done = min(start + batch_size, len(rows))
        if done == len(rows) or (start // batch_size) % 50 == 0:
            say(f"pruned {done}/{len(rows)} messages ({total.jobs} jobs) in {time.monotonic() - started:.1f}s")
    if total.changed:
        (run_dir / "changed.json").write_text(json.dumps(total.changed))
        say(f"{len(total.changed)} messages changed since export: kept in PostgreSQL (see changed.json)")
    _mark(run_dir, PRUNED, total.as_dict())
    return total


def archive_recover(*, spark, out: Path, batch_size: int, say: Callable[[str], None]):
    """Finish what earlier (interrupted) runs left: discard unverified ones, publish and prune
    verified ones. Returns the ids of the runs it touched and what it pruned."""
    runs_dir = out / RUNS
    touched, pruned = [], prune_module.PruneCounts()
    for run_dir in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if not run_dir.is_dir() or (run_dir / PRUNED).exists():
            continue
        run_id = run_dir.name
        touched.append(run_id)
        if not (run_dir / VERIFIED).exists():
            say(f"run {run_id} was interrupted before verification: discarding its staged files")
            shutil.rmtree(run_dir)
            continue
        if not (run_dir / PUBLISHED).exists():
            say(f"run {run_id} was verified but not published: publishing")
            archive_publish(out=out, run_id=run_id)
        say(f"run {run_id} was published but not fully pruned: pruning")
        pruned.add(archive_prune(spark=spark, out=out, run_id=run_id, batch_size=batch_size, say=say))
    return touched, pruned


@contextmanager
def _locked(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ArchiveBusy(f"another archive run is using {out}") from exc
        if not prune_module.archive_lock_acquire():
            raise ArchiveBusy("another archive run is pruning this database")
        try:
            yield
        finally:
            prune_module.archive_lock_release()
            fcntl.flock(fh, fcntl.LOCK_UN)


def messages_archive(*, spark, out_dir: str | Path, older_than: timedelta | str,
                     dead_older_than: timedelta | str | None = None, now: datetime | None = None,
                     batch_size: int = 1000, progress: Callable[[str], None] | None = None) -> ArchiveResult:
    """Archive eligible messages to Parquet, verify, then prune them from PostgreSQL."""
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    out = Path(out_dir).resolve()
    older_than = duration_parse(older_than)
    dead_older_than = duration_parse(dead_older_than if dead_older_than is not None
                                     else settings.BROKER_DEAD_RETENTION)
    now = now or prune_module.database_now()
    cutoff, dead_cutoff = now - older_than, now - dead_older_than
    result = ArchiveResult(out_dir=out)
    with _locked(out):
        t = time.monotonic()
        result.recovered, pruned = archive_recover(spark=spark, out=out, batch_size=batch_size, say=say)
        result.timings["recover"] = time.monotonic() - t
        run_id = now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]
        say(f"run {run_id}: messages received before {cutoff.isoformat()} with every job delivered "
            f"(or dead since before {dead_cutoff.isoformat()})")
        (out / RUNS / run_id).mkdir(parents=True)
        t = time.monotonic()
        sources = archive_export(spark=spark, out=out, run_id=run_id, cutoff=cutoff, dead_cutoff=dead_cutoff,
                                 say=say)
        result.timings["export"] = time.monotonic() - t
        if sources:
            result.run_id = run_id
            t = time.monotonic()
            result.exported = archive_verify(spark=spark, out=out, run_id=run_id, sources=sources, say=say)
            result.timings["verify"] = time.monotonic() - t
            t = time.monotonic()
            archive_publish(out=out, run_id=run_id)
            result.timings["publish"] = time.monotonic() - t
            t = time.monotonic()
            pruned.add(archive_prune(spark=spark, out=out, run_id=run_id, batch_size=batch_size, say=say))
            result.timings["prune"] = time.monotonic() - t
        else:
            shutil.rmtree(out / RUNS / run_id)
            say("nothing (more) to archive")
        result.pruned, result.changed = pruned.as_dict(), pruned.changed
    result.seconds = time.monotonic() - t0
    return result
