"""The analytics report on a real local Spark over the test PostgreSQL: every figure is
recomputed with the Django ORM and must match."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count, F, IntegerField, Min, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce, TruncHour

from broker.models import Message
from jobs.models import DeliveryAttempt, Job, JobTransition
from tests.pipeline.spark.workload import SECRET_MARK, workload_report

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

QUEUED, INFLIGHT, DELIVERED, DEAD = 1001, 1002, 1003, 1004


def percentile_cont(values: list[float], q: float) -> float | None:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def orm_figures(since: datetime, until: datetime) -> dict:
    """Every figure of the report, from the ORM (and plain Python for percentiles)."""
    scope = Job.objects.filter(message__received_at__gte=since, message__received_at__lt=until)
    keys = {"ch": F("channel__channel_id"), "co": F("consumer__consumer_id")}
    counts = dict(
        jobs=Count("id"), delivered=Count("id", filter=Q(status=DELIVERED)), dead=Count("id", filter=Q(status=DEAD)),
        queued=Count("id", filter=Q(status=QUEUED)), inflight=Count("id", filter=Q(status=INFLIGHT)),
    )
    first_delivery = (JobTransition.objects.filter(job_id=OuterRef("pk"), to_status=DELIVERED)
                      .values("job_id").annotate(at=Min("at")).values("at"))
    delivered = scope.filter(status=DELIVERED).annotate(
        delivered_at=Coalesce(Subquery(first_delivery), F("status_changed_at")), **keys)

    summary = {}
    latencies: dict[tuple, list[float]] = defaultdict(list)
    for row in delivered.values("ch", "co", "delivered_at", "message__received_at"):
        ms = (row["delivered_at"] - row["message__received_at"]).total_seconds() * 1000
        for key in (("consumer", row["ch"], row["co"]), ("channel", row["ch"], None), ("all", None, None)):
            latencies[key].append(ms)
    for level, group in (("consumer", ("ch", "co")), ("channel", ("ch",)), ("all", ())):
        rows = scope.annotate(**keys).values(*group).annotate(**counts) if group else [scope.aggregate(**counts)]
        for row in rows:
            key = (level, row.get("ch"), row.get("co"))
            values = latencies.get(key, [])
            summary[key] = {
                **{k: row[k] for k in counts}, "pending": row["queued"] + row["inflight"],
                "latency_p50_ms": percentile_cont(values, 0.5), "latency_p95_ms": percentile_cont(values, 0.95),
                "latency_p99_ms": percentile_cont(values, 0.99),
                "latency_avg_ms": sum(values) / len(values) if values else None,
            }

    n_attempts = (DeliveryAttempt.objects.filter(job_id=OuterRef("pk")).values("job_id")
                  .annotate(n=Count("id")).values("n"))
    histogram = {
        (r["ch"], r["co"], r["attempts"]): r["jobs"]
        for r in scope.annotate(attempts=Coalesce(Subquery(n_attempts, output_field=IntegerField()), Value(0)), **keys)
        .values("ch", "co", "attempts").annotate(jobs=Count("id"))
    }

    owner = Job.objects.filter(pk=OuterRef("job_id"))
    attempts = DeliveryAttempt.objects.filter(job_id__in=scope.values("id")).annotate(
        channel=Subquery(owner.values("channel__channel_id")), consumer=Subquery(owner.values("consumer__consumer_id")))
    failures: dict[tuple, Counter] = defaultdict(Counter)
    for r in (attempts.filter(status_code__isnull=False).exclude(status_code__gte=200, status_code__lt=300)
              .values("channel", "consumer", "status_code").annotate(n=Count("id"))):
        failures[(r["channel"], r["consumer"], "status_code")][f"HTTP {r['status_code']}"] += r["n"]
    for r in attempts.exclude(error="").values("channel", "consumer", "error").annotate(n=Count("id")):
        reason = r["error"].strip().split("\n")[0].strip()[:200]
        failures[(r["channel"], r["consumer"], "error")][reason] += r["n"]
    top = {}
    for key, counter in failures.items():
        ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        for rank, (reason, n) in enumerate(ranked, 1):
            top[key + (rank,)] = (reason, n)

    throughput: dict[tuple, dict] = defaultdict(lambda: {"published": 0, "delivered": 0})
    for r in scope.annotate(hour=TruncHour("message__received_at"), **keys).values(
            "ch", "co", "hour").annotate(n=Count("id")):
        throughput[(r["ch"], r["co"], r["hour"])]["published"] = r["n"]
    for r in delivered.annotate(hour=TruncHour("delivered_at")).values("ch", "co", "hour").annotate(
            n=Count("id")):
        throughput[(r["ch"], r["co"], r["hour"])]["delivered"] = r["n"]
    return {"summary": summary, "histogram": histogram, "failures": top, "throughput": dict(throughput),
            "jobs": scope.count()}


def partitions_with_completion_times(now: datetime) -> None:
    """Three COMPLETE partitions that took 10, 20 and 30 s and one still open (report input only:
    the partition lifecycle itself is tested in tests/jobs/partitions)."""
    from consumers.models import Consumer
    from jobs.models import Partition, PartitionStatus

    consumer = Consumer.objects.order_by("pk").first()
    for i, seconds in enumerate((10, 20, 30)):
        start = now - timedelta(minutes=5 + i)
        Partition.objects.create(consumer=consumer, key=f"done-{i}", status=PartitionStatus.COMPLETE, closed=True,
                                 created_at=start, updated_at=start + timedelta(seconds=seconds),
                                 completed_at=start + timedelta(seconds=seconds))
    Partition.objects.create(consumer=consumer, key="open", created_at=now, updated_at=now)


def test_report_figures_match_the_orm(spark, tmp_path, pipeline_dir, capsys):
    now = datetime.now(timezone.utc)
    workload_report(now=now)
    partitions_with_completion_times(now)
    since = now - timedelta(days=10)
    out = tmp_path / "report"

    call_command("pipeline", "report", "--since", since.isoformat(), "--until", now.isoformat(), "--out", str(out))
    printed = capsys.readouterr().out
    assert "[pipeline]" in printed and "report:" in printed and str(out / "report.html") in printed

    figures = json.loads((out / "report.json").read_text())
    expected = orm_figures(since, now)
    assert figures["jobs"] == expected["jobs"] == 160  # the 20 older messages' jobs are out of scope

    got = {(r["level"], r["channel"], r["consumer"]): r for r in figures["summary"]}
    assert set(got) == set(expected["summary"])
    assert len([k for k in got if k[0] == "consumer"]) == 4
    for key, want in expected["summary"].items():
        for name, value in want.items():
            if value is None or isinstance(value, int):
                assert got[key][name] == value, (key, name)
            else:
                assert got[key][name] == pytest.approx(value, rel=1e-9, abs=1e-3), (key, name)

    histogram = {(r["channel"], r["consumer"], r["attempts"]): r["jobs"] for r in figures["attempts_histogram"]}
    assert histogram == expected["histogram"]
    assert {k[2] for k in histogram} >= {0, 1, 2, 3, 4}

    failures = {(r["channel"], r["consumer"], r["kind"], r["rank"]): (r["reason"], r["attempts"])
                for r in figures["failures"]}
    assert failures == expected["failures"]
    reasons = {reason for reason, _ in failures.values()}
    assert "ReadTimeout: read timed out" in reasons and "HTTP 503" in reasons  # first line of the error
    assert not any(r.startswith("HTTP 2") for r in reasons)  # 2xx and pull outcomes are not failures

    throughput = {(r["channel"], r["consumer"], datetime.fromisoformat(r["hour"])): {
        "published": r["published"], "delivered": r["delivered"]} for r in figures["throughput"]}
    assert throughput == expected["throughput"]

    parts = figures["partitions"]
    assert "partitions" not in figures["sections_skipped"]
    assert parts["partitions"] == 4 and parts["completed"] == 3  # the open partition has no completion time
    assert parts["completion_p50_s"] == pytest.approx(20.0)
    assert parts["completion_p95_s"] == pytest.approx(29.0)  # interpolated between 20 and 30 s
    assert parts["completion_max_s"] == pytest.approx(30.0)
    assert [round(r["completion_s"]) for r in parts["slowest"]] == [30, 20, 10]  # slowest first

    # the rows: one per job, in the facts (partitioned by day and channel) for the finished days
    # and read again next time for the others; aggregates as Parquet next to the report
    assert not (out / "jobs").exists()
    days = {d["day"]: d for d in figures["days"]}
    assert len(days) == 11 and figures["complete"] and not figures["incomplete_days"]
    written = [d for d in figures["days"] if d["facts_written"]]
    assert written and all(d["finished"] for d in written)
    assert not days[now.date().isoformat()]["facts_written"]  # today is not over
    facts_dir = pipeline_dir / "facts" / "v1"
    facts = spark.read.parquet(*[str(p) for p in facts_dir.glob("jobs/day=*/channel=*/*.parquet")])
    assert facts.count() == sum(d["jobs"] for d in written) > 0
    assert {"latency_us", "attempts", "delivered_at"} <= set(facts.columns)
    assert sorted(p.stem for p in (facts_dir / "days").glob("*.json")) == sorted(d["day"] for d in written)
    assert figures["jdbc_rows"]["jobs"] == Job.objects.filter(
        message__received_at__gte=since.replace(hour=0, minute=0, second=0, microsecond=0)).count()
    for name in ("summary", "attempts", "failures", "throughput"):
        assert spark.read.parquet(str(out / name)).count() == len(
            figures["attempts_histogram" if name == "attempts" else name])

    html = (out / "report.html").read_text()
    assert html.count("<svg") == 5 and "Top failure reasons" in html and "Throughput per hour" in html
    for consumer in ("r-c00", "r-c01", "r-c10", "r-c11"):
        assert consumer in html
    assert "Partition completion times" in html and "3 of 4 partitions completed" in html
    assert "done-2" in html and "COMPLETE" in html
    assert sorted(p.name for p in (out / "charts").iterdir()) == [
        "attempts.svg", "failures.svg", "latency.svg", "outcomes.svg", "throughput.svg"]
    assert SECRET_MARK not in html and SECRET_MARK not in (out / "report.json").read_text()

    from pipeline.latest import pipeline_report_latest

    latest = pipeline_report_latest()
    assert latest["html"] == str(out / "report.html") and latest["jobs"] == 160


@pytest.mark.urls("tests.pipeline.spark.urls")
def test_admin_link_serves_the_latest_report(spark, tmp_path, pipeline_dir, admin_client, client):
    from pipeline.latest import pipeline_report_latest
    from pipeline.report import pipeline_report_build

    assert admin_client.get("/pipeline/reports/latest/").status_code == 404
    now = datetime.now(timezone.utc)
    report = pipeline_report_build(spark=spark, since=now - timedelta(days=1), out_dir=tmp_path / "r")
    assert report.jobs == 0  # an empty database still gives a report
    assert pipeline_report_latest()["html"] == str(report.html_path)
    response = admin_client.get("/pipeline/reports/latest/")
    assert response.status_code == 200
    assert b"Delivery report" in b"".join(response.streaming_content)
    assert client.get("/pipeline/reports/latest/").status_code == 302  # staff only

    from django.template import engines

    link = engines["django"].from_string("{% load pipeline_tags %}{% pipeline_latest_report_link %}").render({})
    assert 'href="/pipeline/reports/latest/"' in link


def test_readers_read_in_chunks_and_never_read_secrets(spark, settings):
    from pipeline import readers
    from pipeline.session import jdbc_options_build

    assert connection.settings_dict["NAME"] in jdbc_options_build()["url"]  # the test database
    # the pipeline's sessions carry the broker's session options (jit = off, issue 21)
    jit = spark.read.format("jdbc").options(**jdbc_options_build(), query="SELECT current_setting('jit') AS jit")
    assert [row.jit for row in jit.load().collect()] == ["off"]
    now = datetime.now(timezone.utc)
    workload_report(now=now, messages_per_channel=10, out_of_scope=0)
    settings.BROKER_PIPELINE_CHUNK_ROWS = 5
    low, high = readers.table_bounds(table="jobs_job")
    jobs = readers.jobs_read(spark=spark, num_partitions=3)
    chunks = readers.chunk_count(low=low, high=high)
    assert chunks == 8 and Job.objects.count() == 40
    # eight queries (chunks), read by three tasks
    assert f"[numPartitions={chunks}]" in jobs._jdf.queryExecution().executedPlan().toString()
    assert jobs.rdd.getNumPartitions() == 3
    assert jobs.count() == Job.objects.count()
    assert sorted(r["id"] for r in jobs.select("id").collect()) == sorted(Job.objects.values_list("id", flat=True))
    frames = [readers.channels_read(spark=spark), readers.producers_read(spark=spark),
              readers.consumers_read(spark=spark), readers.messages_read(spark=spark, payload=True), jobs,
              readers.transitions_read(spark=spark), readers.attempts_read(spark=spark)]
    for frame in frames:
        assert not set(frame.columns) & readers.SECRET_COLUMNS
    for row in frames[3].select("headers").collect():
        headers = json.loads(row["headers"])
        assert "X-Trace" in headers and "Authorization" not in headers and "X-Api-Key" not in headers


def test_reader_time_bounds_are_pushed_down_to_postgresql(spark):
    """The registry's statements carry no time bound: the readers filter in Spark, and Spark must
    send that filter to PostgreSQL (else every read would ship the whole table)."""
    from pipeline import readers

    now = datetime(2026, 3, 29, 12, tzinfo=timezone.utc)  # a DST change in Europe: UTC must not care
    workload_report(now=now, messages_per_channel=10, out_of_scope=3)
    since, until = now - timedelta(hours=30), now - timedelta(minutes=1)
    window = {"message__received_at__gte": since, "message__received_at__lt": until}
    # the dataset's live reads: two ranges (days without facts around one with), one WHERE of ORs
    gap = (since + timedelta(hours=6), since + timedelta(hours=10))
    ranges = [(since, gap[0]), (gap[1], until)]
    bounds = readers.window_bounds(ranges=ranges)
    facts = readers.live_read(spark=spark, table="jobs", ranges=ranges, bounds=bounds)
    spark.conf.set("spark.sql.maxMetadataStringLength", "10000")  # the plan's text, untruncated
    try:
        plan = facts._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.unset("spark.sql.maxMetadataStringLength")
    pushed = plan.split("PushedFilters: [")[1].split("]")[0]
    assert "GreaterThanOrEqual(received_at,2026-03-28 06:00:00" in pushed, pushed  # since, in UTC
    assert "LessThan(received_at,2026-03-29 11:59:00" in pushed, pushed
    assert "Or(" in pushed and "LessThan(received_at,2026-03-28 12:00:00" in pushed, pushed
    in_ranges = Job.objects.filter(**window).exclude(message__received_at__gte=gap[0],
                                                     message__received_at__lt=gap[1])
    assert facts.count() == in_ranges.count() > 0
    assert readers.jobs_read(spark=spark, since=since, until=until).count() == Job.objects.filter(**window).count()
    attempts = readers.live_read(spark=spark, table="attempts", ranges=ranges, bounds=bounds)
    assert attempts.count() == DeliveryAttempt.objects.filter(job_id__in=in_ranges.values("id")).count()
    transitions = readers.live_read(spark=spark, table="transitions", ranges=ranges, bounds=bounds)
    assert transitions.count() == JobTransition.objects.filter(job_id__in=in_ranges.values("id")).count()
    messages = readers.messages_read(spark=spark, since=since)
    assert "payload" not in messages.columns and "payload" in readers.messages_read(spark=spark, payload=True).columns
    assert messages.count() == Message.objects.filter(received_at__gte=since).count() < Message.objects.count()
