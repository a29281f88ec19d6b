"""The dataset: jobs, delivery attempts and job transitions, each one table whatever its age.

Rows belong to the UTC day their message was published (``pipeline.days``); each day is read from
one place:

- the facts (``pipeline.facts``, under ``BROKER_PIPELINE_DIR/facts``): the days already read once
  they were finished; nothing of such a day is read again, from anywhere;
- otherwise the archive (the Parquet ``pipeline archive`` moved out of PostgreSQL) together with
  the live database over JDBC (partitioned reads of only these days' time ranges). A job in both
  (an archived message that changed afterwards and stayed in PostgreSQL) is taken from the
  database, the newer state.

Retention removes finished messages without archiving them; its ledger (``broker.counters``
RETENTION_DAYS: jobs removed per channel and day) says which days lost rows that neither the
archive nor the database holds. Such a day is listed as incomplete, with the jobs missing per
channel, never silently short. A day's facts keep what was missing when they were written, so a
day written before retention reached it stays complete.

``dataset_read(write=True)`` (the report) commits every finished day it read as facts, one writer
at a time; ``rebuild=True`` reads every day of the window again and replaces its facts, unless
the new read is less complete than the facts (retention removed rows since): that day keeps its
facts and says so. The notebook reads the same way without writing.
"""

from __future__ import annotations

import shutil
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from django.conf import settings

from broker.counters import RETENTION_DAYS
from broker.models import Channel
from broker.queries import Q as BROKER_Q
from consumers.models import Consumer
from pipeline.days import (RetryPolicy, day_parse, day_ranges, days_covering, finish_rule_build, ledger_day,
                           day_text)
from pipeline.facts import TABLES, DayMarker, FactsStore
from pipeline.readers import live_read, rows_per_message, window_bounds
from pipeline.source import data_now, read_alias, read_connection, replica_retry

QUEUED, INFLIGHT, DELIVERED = 1001, 1002, 1003  # jobs.models.JobStatus
PARTITIONS = ("day", "channel")
FIELDS = {
    "jobs": (("job_id", "long"), ("message_pk", "long"), ("channel_pk", "long"), ("consumer_pk", "long"),
             ("consumer", "string"), ("status", "int"), ("retry_count", "int"), ("attempts", "int"),
             ("received_at", "timestamp"), ("created_at", "timestamp"), ("status_changed_at", "timestamp"),
             ("delivered_at", "timestamp"), ("latency_us", "long")),
    "attempts": (("id", "long"), ("job_id", "long"), ("message_pk", "long"), ("consumer", "string"),
                 ("attempt", "int"), ("started_at", "timestamp"), ("duration_ms", "double"), ("status_code", "int"),
                 ("response_excerpt", "string"), ("error", "string"), ("request_id", "string"),
                 ("outcome", "string"), ("received_at", "timestamp")),
    "transitions": (("id", "long"), ("job_id", "long"), ("message_pk", "long"), ("consumer", "string"),
                    ("from_status", "int"), ("to_status", "int"), ("retry_count", "int"), ("reason", "string"),
                    ("at", "timestamp"), ("received_at", "timestamp")),
}
ARCHIVE_TABLES = ("messages", "jobs", "transitions", "attempts")


@dataclass
class DayCoverage:
    """Where a day's rows came from and whether they are all there."""

    day: str
    source: str  # "facts" (read before) or "read" (archive and database, this run)
    jobs: int = 0
    live_jobs: int = 0
    archived_jobs: int = 0
    finished: str | None = None  # "age", "settled" or None
    written: bool = False  # its facts were written by this run
    missing: dict = field(default_factory=dict)  # channel -> jobs removed by retention, not archived
    note: str = ""

    @property
    def complete(self) -> bool:
        return not any(self.missing.values())

    def as_dict(self) -> dict:
        return {"day": self.day, "source": self.source, "jobs": self.jobs, "live_jobs": self.live_jobs,
                "archived_jobs": self.archived_jobs, "finished": self.finished, "facts_written": self.written,
                "complete": self.complete, "missing_jobs": dict(sorted(self.missing.items())), "note": self.note}


def dataset_schema(table: str, *, partitions: bool = True):
    """The Spark schema of a dataset table as stored (the partition columns last)."""
    from pyspark.sql.types import (DoubleType, IntegerType, LongType, StringType, StructField, StructType,
                                   TimestampType)

    types = {"long": LongType(), "int": IntegerType(), "string": StringType(), "double": DoubleType(),
             "timestamp": TimestampType()}
    fields = [StructField(name, types[kind]) for name, kind in FIELDS[table]]
    if partitions:
        fields += [StructField(name, StringType()) for name in PARTITIONS]
    return StructType(fields)


def _conform(frame, table: str):
    """``frame`` with exactly the table's columns and types (day from received_at, UTC)."""
    from pyspark.sql import functions as F

    columns = [F.col(name).cast(kind).alias(name) for name, kind in FIELDS[table]]
    return frame.select(*columns, F.date_format("received_at", "yyyy-MM-dd").alias("day"),
                        F.col("channel").cast("string").alias("channel"))


def _job_rows(frame):
    """Job rows from the columns of ``job_facts_read`` (live) or the same built from the archive:
    delivered_at is the first DELIVERED transition, else status_changed_at; latency in microseconds
    (exact integers: every sum and percentile is then the same whichever way the rows came)."""
    from pyspark.sql import functions as F

    delivered_at = F.when(F.col("status") == DELIVERED,
                          F.coalesce(F.col("delivered_transition_at"), F.col("status_changed_at")))
    return _conform(frame.select(
        F.col("id").alias("job_id"), F.col("message_id").alias("message_pk"),
        F.col("channel_id").alias("channel_pk"), "channel", F.col("consumer_id").alias("consumer_pk"), "consumer",
        "status", "retry_count", "attempts", "received_at", "created_at", "status_changed_at",
        delivered_at.alias("delivered_at"),
        (F.unix_micros(delivered_at) - F.unix_micros(F.col("received_at"))).alias("latency_us"),
    ), "jobs")


def _parquet_read(spark, *, table: str, base: Path, paths: list[Path]):
    """The dataset rows of ``table`` in ``paths`` (files or partition folders below ``base``): the
    stored schema, day and channel from the folder names as text."""
    if not paths:  # built in the JVM: createDataFrame would start a Python worker on an executor
        from pyspark.sql import functions as F

        return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name)
                                       for f in dataset_schema(table).fields])
    return (spark.read.schema(dataset_schema(table)).option("basePath", str(base))
            .parquet(*[str(p) for p in paths]))


def _partition_files(base: Path, days: list[str]) -> list[Path]:
    return [f for d in days for f in sorted((base / f"day={d}").glob("channel=*/*.parquet"))]


def _stage(frame, path: Path) -> None:
    """Write rows partitioned by day and channel; the reads come in message-id ranges, which follow
    publication time, so a local sort groups each day's rows into a file or two without a shuffle."""
    frame.sortWithinPartitions(*PARTITIONS).write.mode("overwrite").partitionBy(*PARTITIONS).parquet(str(path))


@replica_retry
def retention_ledger() -> dict[str, dict[str, int]]:
    """{day: {channel: jobs retention removed}} from its ledger (``broker.counters`` RETENTION_DAYS,
    summed by the counters' own named statement), read where the rows are read: a replica's ledger
    matches the rows it holds, the primary's may already count rows the replica still has."""
    with read_connection().cursor() as cur:
        cur.execute(BROKER_Q.counter_counts.sql, {"scope": RETENTION_DAYS, "ids": None})
        counts = cur.fetchall()
    names = dict(Channel.objects.using(read_alias()).filter(pk__in={row[0] for row in counts})
                 .values_list("pk", "channel_id"))
    ledger: dict[str, dict[str, int]] = {}
    for channel_pk, number, jobs in counts:
        if jobs:
            ledger.setdefault(day_text(ledger_day(number)), {})[names.get(channel_pk, f"#{channel_pk}")] = int(jobs)
    return ledger


@replica_retry
def finish_rule():
    """When a day is finished, from the broker's retry settings and every consumer's own."""
    return finish_rule_build(RetryPolicy(*row) for row in Consumer.objects.using(read_alias()).values_list(
        "connection_timeout", "max_retry", "retry_backoff"))


class Dataset:
    """The three tables over whole days of publication; ``in_window`` narrows a table to the
    window asked for. ``close()`` (or leaving a ``with`` block) removes this run's staging."""

    def __init__(self, *, spark, since: datetime, until: datetime, store: FactsStore, work: Path,
                 archive: Path, say: Callable[[str], None]):
        self.spark, self.since, self.until = spark, since, until
        self.store, self.work, self.archive, self.say = store, work, archive, say
        self.days: list[DayCoverage] = []
        self.facts_days: list[DayMarker] = []  # committed days, read from the facts
        self.read_days: list[str] = []  # days read from the archive and the database, not committed
        self.ranges: list = []  # the time ranges of the days read from the database
        self.bounds: tuple = (None, None)  # their message ids
        self.fanout: dict[str, float] = {}  # rows per message of each table (the chunks' size)
        self._staged: dict[str, int] = {}  # table -> rows read over JDBC
        self._frames: dict = {}

    # --- the tables ---------------------------------------------------------------------------

    def table(self, name: str):
        """All rows of ``name`` (jobs, attempts, transitions) over the dataset's days."""
        if name not in self._frames:
            if name == "transitions":
                self._live_stage("transitions")  # read only when asked (the report does not need them)
            frame = _parquet_read(self.spark, table=name, base=self.store.base / name,
                                  paths=self.store.files(self.facts_days, name))
            for source in ("live", "archived"):
                root = self.work / source / name
                files = _partition_files(root, self.read_days)
                if files:
                    frame = frame.unionByName(_parquet_read(self.spark, table=name, base=root, paths=files))
            self._frames[name] = _derive(name, frame)
        return self._frames[name]

    @property
    def jobs(self):
        return self.table("jobs")

    @property
    def attempts(self):
        return self.table("attempts")

    @property
    def transitions(self):
        return self.table("transitions")

    def in_window(self, frame):
        """Rows of the messages published in [since, until)."""
        from pyspark.sql import functions as F

        return frame.where((F.col("received_at") >= F.lit(self.since)) & (F.col("received_at") < F.lit(self.until)))

    @property
    def jdbc_rows(self) -> dict[str, int]:
        """Rows read over JDBC so far, per table and in total."""
        rows = {table: self._staged.get(table, 0) for table in TABLES}
        return {**rows, "total": sum(rows.values())}

    @property
    def incomplete(self) -> list[dict]:
        """Day, channel and jobs missing of every day that lost rows to retention, oldest first."""
        return [{"day": d.day, "channel": channel, "missing_jobs": n}
                for d in self.days for channel, n in sorted(d.missing.items()) if n]

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live_stage(self, table: str) -> int:
        """Read ``table``'s live rows of the days read this run over JDBC into the staging, once."""
        if table in self._staged:
            return self._staged[table]
        rows = 0
        if self.ranges and self.bounds[0] is not None:
            t = time.monotonic()
            path = self.work / "live" / table
            frame = live_read(spark=self.spark, table=table, ranges=self.ranges, bounds=self.bounds,
                              rows_per_key=self.fanout.get(table, 1.0))
            _stage(_conform_live(frame, table), path)
            rows = _parquet_read(self.spark, table=table, base=path, paths=[path]).count() if path.exists() else 0
            self.say(f"read {rows} {table} rows over JDBC in {time.monotonic() - t:.1f}s")
        self._staged[table] = rows
        return rows


def _derive(name: str, frame):
    """Columns every reader wants, computed the same way whatever the source."""
    from pyspark.sql import functions as F

    if name == "jobs":
        return frame.withColumn("latency_ms", F.col("latency_us") / F.lit(1000.0))
    if name == "attempts":  # the error's first line, trimmed, at most 200 characters
        error = F.regexp_replace(F.coalesce(F.col("error"), F.lit("")), r"^[ \t\r\n]+|[ \t\r\n]+$", "")
        return frame.withColumn("error_reason", F.substring(F.trim(F.split(error, "\n")[0]), 1, 200))
    return frame


def _conform_live(frame, table: str):
    if table == "jobs":
        return _job_rows(frame)
    return _conform(frame.withColumnRenamed("message_id", "message_pk"), table)


def _archive_dirs(archive: Path, table: str, days: list[str]) -> list[Path]:
    base, wanted = archive / table, {f"day={d}" for d in days}
    return sorted(p for p in base.glob("channel=*/day=*") if p.name in wanted and p.is_dir()) if base.is_dir() else []


def _archive_read(spark, archive: Path, days: list[str]) -> dict:
    """The archive's four tables for ``days`` ({} when it holds none of them; a table without rows
    on those days: None), partition values as text (the archive's day would be inferred as a date)."""
    dirs = {table: _archive_dirs(archive, table, days) for table in ARCHIVE_TABLES}
    if not dirs["jobs"]:
        return {}
    key = "spark.sql.sources.partitionColumnTypeInference.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:  # the file index, with its partition values, is built here, while inference is off
        return {table: spark.read.option("basePath", str(archive / table)).parquet(*[str(p) for p in paths])
                if paths else None for table, paths in dirs.items()}
    finally:
        spark.conf.set(key, before)


def _archived_rows(frames: dict, live_jobs) -> dict:
    """The dataset's rows from the archive's tables, without the jobs the database still holds
    (archived, then changed and kept in PostgreSQL: the live rows are the newer state)."""
    from pyspark.sql import functions as F

    messages = frames["messages"].select(F.col("id").alias("message_id"), "received_at")
    jobs = frames["jobs"].join(live_jobs.select(F.col("job_id").alias("id")), "id", "left_anti")
    owners = jobs.select(F.col("id").alias("job_id"), "consumer", "message_id")
    history, attempts = frames["transitions"], frames["attempts"]
    rows = jobs.join(messages, "message_id")
    if history is not None:
        rows = rows.join(history.where(F.col("to_status") == DELIVERED).groupBy(F.col("job_id").alias("id"))
                         .agg(F.min("at").alias("delivered_transition_at")), "id", "left")
    else:
        rows = rows.withColumn("delivered_transition_at", F.lit(None).cast("timestamp"))
    if attempts is not None:
        rows = rows.join(attempts.groupBy(F.col("job_id").alias("id")).agg(F.count(F.lit(1)).alias("attempts")),
                         "id", "left")
    else:
        rows = rows.withColumn("attempts", F.lit(None).cast("long"))
    out = {"jobs": _job_rows(rows.withColumn("attempts", F.coalesce("attempts", F.lit(0)))
                             .withColumnRenamed("channel_pk", "channel_id")
                             .withColumnRenamed("consumer_pk", "consumer_id"))}
    for table, frame in (("transitions", history), ("attempts", attempts)):
        if frame is not None:  # joined to their (archived, not live) jobs for the consumer
            out[table] = _conform(frame.drop("message_id", "day").join(owners, "job_id")
                                  .join(messages, "message_id").withColumnRenamed("message_id", "message_pk"), table)
    return out


def dataset_read(*, spark, since: datetime, until: datetime, archive_dir: str | Path | None = None,
                 facts_dir: str | Path | None = None, write: bool = False, rebuild: bool = False,
                 say: Callable[[str], None] | None = None, timings: dict | None = None) -> Dataset:
    """The dataset over every UTC day holding a moment of [since, until) (see the module's
    docstring). With ``write``, finished days are committed as facts (one writer at a time: a
    second run waits for the first); with ``rebuild`` every day is read again."""
    say = say or (lambda _msg: None)
    timings = {} if timings is None else timings
    store = FactsStore(facts_dir)
    archive = Path(archive_dir if archive_dir is not None else Path(settings.BROKER_PIPELINE_DIR) / "archive").resolve()
    run_id = f"{'write' if write else 'read'}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    days = [day_text(d) for d in days_covering(since, until)]
    with store.locked(say) if write else nullcontext():
        if write:
            store.collect_garbage()
        ds = Dataset(spark=spark, since=since, until=until, store=store, work=store.work_dir(run_id),
                     archive=archive, say=say)
        try:
            _days_read(ds, days=days, write=write, rebuild=rebuild, run_id=run_id, timings=timings)
        except BaseException:
            ds.close()
            raise
    return ds


def _day_stats(ds: Dataset, days: list[str]) -> dict[str, dict]:
    """Per day read this run: its jobs from the database and from the archive, and how many of
    them are still QUEUED or INFLIGHT."""
    from pyspark.sql import functions as F

    stats = {d: {"live": 0, "archived": 0, "pending": 0} for d in days}
    pending = F.sum(F.when(F.col("status").isin(QUEUED, INFLIGHT), 1).otherwise(0))
    for source in ("live", "archived"):
        root = ds.work / source / "jobs"
        files = _partition_files(root, days)
        if files:
            frame = _parquet_read(ds.spark, table="jobs", base=root, paths=files)
            for row in frame.groupBy("day").agg(F.count(F.lit(1)).alias("n"), pending.alias("p")).collect():
                stats[row["day"]][source] += row["n"]
                stats[row["day"]]["pending"] += row["p"]
    return stats


def _days_read(ds: Dataset, *, days: list[str], write: bool, rebuild: bool, run_id: str, timings: dict) -> None:
    say = ds.say
    committed = ds.store.markers(days)
    to_read = list(days) if rebuild else [d for d in days if d not in committed]
    say(f"{len(days)} days in the window: {len(days) - len(to_read)} from the facts in {ds.store.base}, "
        f"{len(to_read)} read from the archive and the database")
    kept = {d: m for d, m in committed.items() if d not in to_read}
    coverage: dict[str, DayCoverage] = {}
    if to_read:
        t = time.monotonic()
        ledger_before = retention_ledger() if write else {}
        now = data_now()
        ds.ranges = day_ranges(day_parse(d) for d in to_read)
        ds.bounds = window_bounds(ranges=ds.ranges)
        ds.fanout = rows_per_message()
        ds._live_stage("jobs")
        ds._live_stage("attempts")
        timings["read_live"] = time.monotonic() - t
        t = time.monotonic()
        archived = _archive_read(ds.spark, ds.archive, to_read)
        if archived:
            say(f"reading the archive in {ds.archive}")
            live = _parquet_read(ds.spark, table="jobs", base=ds.work / "live" / "jobs",
                                 paths=_partition_files(ds.work / "live" / "jobs", to_read))
            for table, frame in _archived_rows(archived, live).items():
                _stage(frame, ds.work / "archived" / table)
        timings["read_archive"] = time.monotonic() - t
        stats = _day_stats(ds, to_read)
        ledger, rule = retention_ledger(), finish_rule()
        for d in to_read:
            s = stats[d]
            coverage[d] = DayCoverage(day=d, source="read", jobs=s["live"] + s["archived"], live_jobs=s["live"],
                                      archived_jobs=s["archived"], missing=dict(ledger.get(d, {})),
                                      finished=rule.finished(day=day_parse(d), now=now, pending_jobs=s["pending"]))
        if write:
            _days_commit(ds, coverage=coverage, committed=committed, kept=kept, changed={
                d for d in to_read if ledger.get(d, {}) != ledger_before.get(d, {})}, run_id=run_id, timings=timings)
    ds.facts_days = [kept[d] for d in days if d in kept]
    ds.read_days = [d for d in to_read if d not in kept]
    ds.days = [_coverage(d, coverage.get(d), kept.get(d)) for d in days]


def _coverage(day: str, read: DayCoverage | None, marker: DayMarker | None) -> DayCoverage:
    """A day's coverage: as read this run unless its rows come from facts written before."""
    if read is not None and (read.written or marker is None):
        return read
    return _facts_coverage(marker, note=read.note if read else "")


def _days_commit(ds: Dataset, *, coverage: dict, committed: dict, kept: dict, changed: set, run_id: str,
                 timings: dict) -> None:
    """Commit every finished day read this run (under the writer's lock)."""
    commits = []
    for d, cov in coverage.items():
        old = committed.get(d)
        if d in changed:
            cov.note = "retention removed rows of this day while it was read: read again next time"
        elif not cov.finished:
            if old is not None:  # a rebuild found it changing again (a requeue): read live until finished
                ds.store.uncommit(d)
        elif old is not None and old.missing_jobs < sum(cov.missing.values()):
            cov.note = (f"kept its facts of {old.written_at[:19]}: retention has since removed jobs the "
                        "archive does not hold")
            kept[d] = old
        else:
            commits.append(cov)
    if not commits:
        return
    t = time.monotonic()
    ds._live_stage("transitions")  # a day's facts hold its whole history
    for cov in commits:
        staged = {table: [(f, ds.work / src / table) for src in ("live", "archived")
                          for f in _partition_files(ds.work / src / table, [cov.day])] for table in TABLES}
        kept[cov.day] = ds.store.commit(day=cov.day, generation=run_id, staged=staged, finished=cov.finished,
                                        rows={"jobs": cov.jobs}, missing=cov.missing,
                                        sources={"live": cov.live_jobs, "archived": cov.archived_jobs})
        cov.written = True
    timings["write_facts"] = time.monotonic() - t
    ds.say(f"facts written for {len(commits)} finished days ({commits[0].day} to {commits[-1].day}) "
           f"in {timings['write_facts']:.1f}s")


def _facts_coverage(marker: DayMarker, note: str = "") -> DayCoverage:
    return DayCoverage(day=marker.day, source="facts", jobs=marker.rows.get("jobs", 0),
                       live_jobs=marker.sources.get("live", 0), archived_jobs=marker.sources.get("archived", 0),
                       finished=marker.finished, missing=dict(marker.missing), note=note)
