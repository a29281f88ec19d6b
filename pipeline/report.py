"""Delivery analytics: what happened to the jobs of the messages published in a time window.

The rows come from the dataset (``pipeline.dataset``): the facts of the days already read, the
archive and the live database, as one table whatever their age; days that lost rows to retention
are listed as incomplete. Definitions (the tests recompute each with the Django ORM):

- scope: jobs whose message was received (published) in ``[since, until)``;
- counts per channel and consumer: jobs, delivered (1003), dead (1004), queued (1001),
  inflight (1002), pending = queued + inflight; rolled up per channel and overall;
- latency: delivered_at - message.received_at in milliseconds, over delivered jobs, where
  delivered_at is the job's (first) DELIVERED transition, or its ``status_changed_at`` when the
  history lacks one; p50/p95/p99 are exact, linearly interpolated (PostgreSQL percentile_cont;
  ``pipeline.percentiles``), the mean from the exact sum of the microseconds;
- attempts histogram: jobs by their number of ``jobs_deliveryattempt`` rows (0 = never tried);
- top failure reasons, per consumer, top 10 by attempts: status codes (attempts answered with a
  non-2xx code, as "HTTP <code>") and errors (attempts with an error; its first line, trimmed,
  at most 200 characters); ties are broken by the reason text;
- throughput per hour (UTC): jobs published and jobs delivered in each hour;
- partition completion times: from ``jobs_partition`` (created_at to completed_at),
  otherwise the section is skipped and says so.

Outputs under ``out_dir``: ``summary/``, ``attempts/``, ``failures/``, ``throughput/`` (and
``partitions/``) as Parquet, ``report.json`` (every figure, the days read and from where, the rows
read over JDBC), ``charts/*.svg`` and ``report.html``. The rows themselves stay in the facts.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from jobs.models import JobStatus
from pipeline import charts
from pipeline.dataset import Dataset, dataset_read
from pipeline.facts import SCHEMA_VERSION
from pipeline.latest import pipeline_report_record
from pipeline.percentiles import exact_percentiles
from pipeline.queries import Q
from pipeline.readers import jdbc_read, table_bounds
from pipeline.source import read_connection, replica_retry

QUEUED, INFLIGHT, DELIVERED, DEAD = (s.value for s in (JobStatus.QUEUED, JobStatus.INFLIGHT,
                                                       JobStatus.DELIVERED, JobStatus.DEAD))
TOP_FAILURES = 10
PARTITION_TABLE = "jobs_partition"
ALL = "(all)"
QUANTILES = (0.5, 0.95, 0.99)
NO_PARTITIONS = {"partitions": 0, "completed": 0, "completion_p50_s": None, "completion_p95_s": None,
                 "completion_p99_s": None, "completion_max_s": None, "slowest": []}
COUNTS = ("jobs", "delivered", "dead", "queued", "inflight", "latency_n", "latency_sum_us")  # additive
SUMMARY_COLUMNS = (("level", "string"), ("channel", "string"), ("consumer", "string"), ("jobs", "long"),
                   ("delivered", "long"), ("dead", "long"), ("queued", "long"), ("inflight", "long"),
                   ("pending", "long"), ("latency_p50_ms", "double"), ("latency_p95_ms", "double"),
                   ("latency_p99_ms", "double"), ("latency_avg_ms", "double"), ("latency_max_ms", "double"))


@dataclass
class Report:
    out_dir: Path
    html_path: Path
    figures: dict
    timings: dict = field(default_factory=dict)
    jobs: int = 0


def report_counts_build(jobs):
    """Jobs per (channel, consumer, number of attempts, hour published, hour delivered): by status,
    and the count, exact sum and maximum of the latencies in microseconds. The one scan of the jobs
    the attempts histogram, the summary's counts and the throughput all come from (few groups: a
    job is mostly delivered within the hour it was published in, or the next)."""
    from pyspark.sql import functions as F

    def count_of(status: int):
        return F.sum(F.when(F.col("status") == status, 1).otherwise(0)).cast("long")

    return jobs.groupBy("channel", "consumer", "attempts", F.date_trunc("hour", "received_at").alias("published"),
                        F.date_trunc("hour", "delivered_at").alias("delivered_hour")).agg(
        F.count(F.lit(1)).alias("jobs"), count_of(DELIVERED).alias("delivered"), count_of(DEAD).alias("dead"),
        count_of(QUEUED).alias("queued"), count_of(INFLIGHT).alias("inflight"),
        F.count("latency_us").alias("latency_n"), F.sum("latency_us").alias("latency_sum_us"),
        F.max("latency_us").alias("latency_max_us"))


def report_attempts_build(counts):
    """``report_counts_build``'s groups per (channel, consumer, number of attempts)."""
    from pyspark.sql import functions as F

    return counts.groupBy("channel", "consumer", "attempts").agg(
        *[F.sum(name).alias(name) for name in ("jobs", *COUNTS[1:])], F.max("latency_max_us").alias("latency_max_us"))


def report_throughput_build(counts):
    """Jobs published and delivered per UTC hour, per consumer, from ``report_counts_build``'s
    groups (a job counts as published in its publish hour and, once delivered, as delivered in its
    delivery hour)."""
    from pyspark.sql import functions as F

    published = counts.groupBy("channel", "consumer", F.col("published").alias("hour")).agg(
        F.sum("jobs").alias("published"), F.lit(0).cast("long").alias("delivered"))
    delivered = counts.where(F.col("delivered_hour").isNotNull()).groupBy(
        "channel", "consumer", F.col("delivered_hour").alias("hour")).agg(
        F.lit(0).cast("long").alias("published"), F.sum("jobs").alias("delivered"))
    return published.unionByName(delivered).groupBy("channel", "consumer", "hour").agg(
        F.sum("published").cast("long").alias("published"), F.sum("delivered").cast("long").alias("delivered"))


def report_summary_build(counts: list, percentiles: dict) -> list[dict]:
    """Counts and latency per consumer, per channel and overall, from ``report_counts_build``'s
    rows and ``pipeline.percentiles.exact_percentiles``; the mean from the summed microseconds,
    so every figure is the same however the rows were split into files."""
    groups: dict[tuple, dict] = {("all", None, None): {name: 0 for name in COUNTS} | {"latency_max_us": None}}
    for r in counts:
        for key in (("consumer", r["channel"], r["consumer"]), ("channel", r["channel"], None), ("all", None, None)):
            g = groups.setdefault(key, {name: 0 for name in COUNTS} | {"latency_max_us": None})
            for name in COUNTS:
                g[name] += r[name] or 0
            if r["latency_max_us"] is not None:
                g["latency_max_us"] = (r["latency_max_us"] if g["latency_max_us"] is None
                                       else max(g["latency_max_us"], r["latency_max_us"]))
    summary = []
    for (level, channel, consumer), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "",
                                                                                 kv[0][2] or "")):
        p = percentiles.get((level, channel, consumer), [None] * len(QUANTILES))
        n = g["latency_n"]
        summary.append({
            "level": level, "channel": channel, "consumer": consumer,
            **{name: g[name] for name in ("jobs", "delivered", "dead", "queued", "inflight")},
            "pending": g["queued"] + g["inflight"],
            "latency_p50_ms": p[0], "latency_p95_ms": p[1], "latency_p99_ms": p[2],
            "latency_avg_ms": g["latency_sum_us"] / n / 1000.0 if n else None,
            "latency_max_ms": g["latency_max_us"] / 1000.0 if g["latency_max_us"] is not None else None,
        })
    return summary


def report_failures_build(attempts, *, top: int = TOP_FAILURES):
    """Top failure reasons per consumer: non-2xx status codes and error texts, by attempts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    code = F.col("status_code")
    codes = attempts.where(code.isNotNull() & ((code < 200) | (code >= 300))).select(
        "channel", "consumer", F.lit("status_code").alias("kind"),
        F.concat(F.lit("HTTP "), code.cast("string")).alias("reason"))
    # the error's first line is cut out only where there is an error (most attempts have none)
    errors = attempts.where(F.col("error") != "").where(F.col("error_reason") != "").select(
        "channel", "consumer", F.lit("error").alias("kind"), F.col("error_reason").alias("reason"))
    counted = codes.unionByName(errors).groupBy("channel", "consumer", "kind", "reason").agg(
        F.count(F.lit(1)).alias("attempts"))
    window = Window.partitionBy("channel", "consumer", "kind").orderBy(F.desc("attempts"), F.asc("reason"))
    return counted.withColumn("rank", F.row_number().over(window)).where(F.col("rank") <= top)


def report_partitions_build(*, spark):
    """Partition completion times, or (None, why) when there is nothing to measure."""
    from pyspark.sql import functions as F

    if not _partitions_exist():
        return None, f"skipped: table {PARTITION_TABLE} does not exist"
    if table_bounds(table=PARTITION_TABLE)[0] is None:
        return None, ""  # no partition at all: nothing for Spark to read
    frame = jdbc_read(spark=spark, query=Q.partitions_read, bounds_table=PARTITION_TABLE)
    frame = frame.withColumn("completion_s", (F.unix_micros("completed_at") - F.unix_micros("started_at")) / 1e6)
    return frame, ""


@replica_retry
def _partitions_exist() -> bool:
    conn = read_connection()
    with conn.cursor() as cur:
        return PARTITION_TABLE in conn.introspection.table_names(cur)


def _rows(frame, order: list[str]) -> list[dict]:
    """Collect a small aggregate as dicts; timestamps become ISO strings in UTC, formatted by
    Spark (PySpark would hand back naive datetimes in the driver's local time zone)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    columns = [
        F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSSxxx").alias(f.name)
        if isinstance(f.dataType, TimestampType) else F.col(f.name)
        for f in frame.schema.fields
    ]
    return [row.asDict() for row in frame.orderBy(*order).select(*columns).collect()]


def report_partitions_figures(frame) -> dict:
    from pyspark.sql import functions as F

    done = frame.where(F.col("completed_at").isNotNull())
    agg = done.agg(F.count(F.lit(1)).alias("completed"),
                   F.percentile("completion_s", [0.5, 0.95, 0.99]).alias("p"),
                   F.max("completion_s").alias("max_s")).collect()[0]
    p = agg["p"] or [None, None, None]
    return {
        "partitions": frame.count(), "completed": agg["completed"],
        "completion_p50_s": p[0], "completion_p95_s": p[1], "completion_p99_s": p[2], "completion_max_s": agg["max_s"],
        "slowest": _rows(done.orderBy(F.desc("completion_s")).limit(20), ["completion_s"])[::-1],
    }


def report_charts_build(figures: dict) -> dict[str, str]:
    """The report's SVG charts, by name, from the figures."""
    per_consumer = [r for r in figures["summary"] if r["level"] == "consumer"]
    names = [f"{r['channel']}/{r['consumer']}" for r in per_consumer]
    out = {
        "latency": charts.svg_bar_chart(
            title="Publish-to-delivery latency per consumer", categories=names, unit="ms",
            series=[(label, [r[f"latency_{key}_ms"] or 0 for r in per_consumer])
                    for label, key in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"))]),
        "outcomes": charts.svg_bar_chart(
            title="Jobs per consumer by outcome", categories=names, unit="jobs",
            series=[(key, [r[key] for r in per_consumer]) for key in ("delivered", "dead", "pending")]),
    }
    hist: dict[int, int] = {}
    for r in figures["attempts_histogram"]:
        hist[r["attempts"]] = hist.get(r["attempts"], 0) + r["jobs"]
    buckets = sorted(hist)
    out["attempts"] = charts.svg_bar_chart(
        title="Attempts per job (all consumers)", categories=[str(b) for b in buckets], unit="jobs",
        series=[("jobs", [hist[b] for b in buckets])])
    hours: dict[datetime, list[int]] = {}
    for r in figures["throughput"]:
        slot = hours.setdefault(datetime.fromisoformat(r["hour"]), [0, 0])
        slot[0] += r["published"]
        slot[1] += r["delivered"]
    labels, published, delivered = [], [], []
    if hours:  # every hour of the span, quiet ones at zero; long spans in buckets of several hours
        first = min(hours)
        step = max(1, math.ceil((max(hours) - first).total_seconds() / 3600 / 2000))
        buckets = int((max(hours) - first).total_seconds() // 3600) // step + 1
        published, delivered = [0] * buckets, [0] * buckets
        for hour, (p, d) in hours.items():
            i = int((hour - first).total_seconds() // 3600) // step
            published[i] += p
            delivered[i] += d
        labels = [(first + timedelta(hours=i * step)).strftime("%m-%d %Hh") for i in range(buckets)]
    out["throughput"] = charts.svg_line_chart(
        title="Throughput per hour (UTC, all consumers)", labels=labels,
        unit="jobs/hour" if len(labels) < 2 or step == 1 else f"jobs per {step} hours",
        series=[("published", published), ("delivered", delivered)])
    totals: dict[str, int] = {}
    for r in figures["failures"]:
        totals[r["reason"]] = totals.get(r["reason"], 0) + r["attempts"]
    top = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FAILURES]
    out["failures"] = charts.svg_hbar_chart(title="Top failure reasons (all consumers)", items=top,
                                            unit="attempts")
    return out


def _literal_frame(spark, rows: list[dict], columns):
    """A small DataFrame of Python rows built from literals in the JVM (no Python worker)."""
    from pyspark.sql import functions as F

    def struct(row):
        return F.struct(*[F.lit(row.get(name)).cast(kind).alias(name) for name, kind in columns])

    if not rows:
        return spark.range(0).select(*[F.lit(None).cast(kind).alias(name) for name, kind in columns])
    return spark.range(1).select(F.inline(F.array(*[struct(r) for r in rows])))


def report_figures_build(*, spark, dataset: Dataset, out: Path | None = None,
                         say: Callable[[str], None] = lambda _msg: None, timings: dict | None = None) -> dict:
    """Every figure of the report over ``dataset``'s window as plain Python data; with ``out`` the
    aggregates are written as Parquet too (the notebook calls this without ``out``)."""
    from pyspark import StorageLevel

    timings = {} if timings is None else timings
    since, until = dataset.since, dataset.until
    t = time.monotonic()
    jobs = dataset.in_window(dataset.jobs)
    figures: dict = {
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "since": since.isoformat(), "until": until.isoformat(), "jobs": 0,
        "sections_skipped": {},
    }
    say("computing summary and attempts")
    mark = time.monotonic()
    counts = report_counts_build(jobs).persist(StorageLevel.MEMORY_AND_DISK)
    per_attempts = report_attempts_build(counts).persist(StorageLevel.MEMORY_AND_DISK)
    rows = per_attempts.collect()
    figures["summary"] = report_summary_build(rows, exact_percentiles(
        jobs, column="latency_us", qs=QUANTILES, scale=1000.0, values=sum(r["latency_n"] for r in rows)))
    figures["jobs"] = figures["summary"][0]["jobs"]  # level "all" sorts first
    figures["attempts_histogram"] = sorted(
        ({"channel": r["channel"], "consumer": r["consumer"], "attempts": r["attempts"], "jobs": r["jobs"]}
         for r in rows), key=lambda r: (r["channel"], r["consumer"], r["attempts"]))
    say(f"{figures['jobs']} jobs in scope")
    timings["summary"] = time.monotonic() - mark
    if out is not None:
        _literal_frame(spark, figures["summary"], SUMMARY_COLUMNS).coalesce(1).write.mode("overwrite").parquet(
            str(out / "summary"))
        per_attempts.select("channel", "consumer", "attempts", "jobs").coalesce(1).write.mode("overwrite").parquet(
            str(out / "attempts"))
    per_attempts.unpersist()
    frames = {
        "throughput": (report_throughput_build(counts), ["hour", "channel", "consumer"]),
        "failures": (report_failures_build(dataset.in_window(dataset.attempts)),
                     ["channel", "consumer", "kind", "rank"]),
    }
    for name, (frame, order) in frames.items():
        say(f"computing {name}")
        mark = time.monotonic()
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        if out is not None:
            frame.coalesce(1).write.mode("overwrite").parquet(str(out / name))
        figures[name] = _rows(frame, order)
        frame.unpersist()
        timings[name] = time.monotonic() - mark
    counts.unpersist()
    partitions, why = report_partitions_build(spark=spark)
    if why:
        figures["partitions"] = None
        figures["sections_skipped"]["partitions"] = why
        say(f"partition completion times {why}")
    elif partitions is None:
        figures["partitions"] = dict(NO_PARTITIONS)
    else:
        if out is not None:
            partitions.coalesce(1).write.mode("overwrite").parquet(str(out / "partitions"))
        figures["partitions"] = report_partitions_figures(partitions)
    figures["days"] = [d.as_dict() for d in dataset.days]
    figures["incomplete_days"] = dataset.incomplete
    figures["complete"] = not figures["incomplete_days"]
    figures["jdbc_rows"] = dataset.jdbc_rows
    figures["facts"] = {
        "dir": str(dataset.store.root), "schema": SCHEMA_VERSION,
        "days_from_facts": sum(1 for d in dataset.days if d.source == "facts"),
        "days_read": sum(1 for d in dataset.days if d.source == "read"),
        "days_written": [d.day for d in dataset.days if d.written],
    }
    figures["archive"] = str(dataset.archive)
    for d in dataset.incomplete:
        say(f"INCOMPLETE: {d['day']} channel {d['channel']}: {d['missing_jobs']} jobs removed by retention "
            "and not in the archive")
    timings["aggregate"] = time.monotonic() - t
    return figures


def pipeline_report_build(*, spark, since: datetime, out_dir: str | Path, until: datetime | None = None,
                          archive_dir: str | Path | None = None, facts_dir: str | Path | None = None,
                          rebuild: bool = False, progress: Callable[[str], None] | None = None,
                          record_latest: bool = True) -> Report:
    """Read the dataset (committing the finished days it read as facts), compute every figure on
    Spark, write Parquet, JSON, SVG charts and the HTML page."""
    say = progress or (lambda _msg: None)
    until = until or datetime.now(timezone.utc)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with dataset_read(spark=spark, since=since, until=until, archive_dir=archive_dir, facts_dir=facts_dir,
                      write=True, rebuild=rebuild, say=say, timings=timings) as dataset:
        timings["read"] = time.monotonic() - t0
        figures = report_figures_build(spark=spark, dataset=dataset, out=out, say=say, timings=timings)
    t = time.monotonic()
    html_path = report_html_write(out_dir=out, figures=figures)
    timings["html"] = time.monotonic() - t
    timings["total"] = time.monotonic() - t0
    figures["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    _json_write(out / "report.json", figures)
    if record_latest:
        pipeline_report_record(out_dir=out, figures=figures)
    say(f"report written: {html_path}")
    return Report(out_dir=out, html_path=html_path, figures=figures, timings=timings, jobs=figures["jobs"])


def report_html_write(*, out_dir: Path, figures: dict) -> Path:
    """The human report: inline SVG charts (also written to charts/*.svg) and tables."""
    svgs = report_charts_build(figures)
    (out_dir / "charts").mkdir(exist_ok=True)
    for name, svg in svgs.items():
        (out_dir / "charts" / f"{name}.svg").write_text(svg, encoding="utf-8")
    failures_by_consumer: dict[str, list[dict]] = {}
    for r in figures["failures"]:
        failures_by_consumer.setdefault(f"{r['channel']}/{r['consumer']}", []).append(r)
    html = render_to_string("pipeline/report.html", {
        "f": figures,
        "charts": {k: mark_safe(v) for k, v in svgs.items()},
        "summary": [dict(r, channel=r["channel"] or ALL, consumer=r["consumer"] or ALL) for r in figures["summary"]],
        "failures_by_consumer": sorted(failures_by_consumer.items()),
        "histogram": figures["attempts_histogram"],
    })
    path = out_dir / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _json_write(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)

