"""Prometheus metrics. Gauges are read from the database at scrape time, so they are correct
whatever number of web processes and worker clusters run."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from rest_framework.views import APIView

from broker import delivery_metrics as dm
from broker.counters import JOB, MESSAGE, REDELIVERED, counts_for
from broker.models import Channel
from consumers.models import Consumer
from consumers.waiters import pull_waiters_count
from jobs.models import JobStatus
from jobs.ops.plans import plan_regressions_count
from jobs.publish.admission import deliveries_lag
from jobs.publish.refusals import publish_refusals_counts
from jobs.push.circuit import circuits_open
from jobs.sweeps import retention
from web.api.sources import SourceCollector


class DatabaseCollector:
    """Backlog, in-flight, delivered and dead jobs, pull waiters, push attempt outcomes and the
    attempt-duration and delivery-latency histograms per channel and consumer: all maintained
    rows (counters, waiter rows), so a scrape reads a bounded number of rows."""

    def collect(self):
        consumers = list(Consumer.objects.select_related("channel").only("id", "consumer_id", "channel__channel_id"))
        job_counts = counts_for(scope=JOB)
        jobs = GaugeMetricFamily("broker_jobs", "Jobs per consumer and status", labels=["channel", "consumer", "status"])
        dead = GaugeMetricFamily("dead_job_count", "Dead jobs per consumer (webhook-broker name)",
                                 labels=["channel", "consumer"])
        backlog = GaugeMetricFamily("broker_consumer_backlog", "QUEUED jobs per consumer", labels=["channel", "consumer"])
        inflight = GaugeMetricFamily("broker_consumer_in_flight", "INFLIGHT jobs per consumer",
                                     labels=["channel", "consumer"])
        redelivered = GaugeMetricFamily("broker_consumer_redelivered", "Jobs being redelivered",
                                        labels=["channel", "consumer"])
        waiting = pull_waiters_count()
        open_circuits = circuits_open()
        circuit = GaugeMetricFamily("broker_consumer_circuit_open",
                                    "1 while the push consumer's circuit breaker is OPEN or HALF_OPEN",
                                    labels=["channel", "consumer"])
        delivery_counts = counts_for(scope=dm.DELIVERY)
        waiters = GaugeMetricFamily("broker_consumer_pull_waiters", "Pull requests waiting for jobs now",
                                    labels=["channel", "consumer"])
        attempts = CounterMetricFamily("broker_push_attempts", "Push attempts by class of answer "
                                       "(2xx, 3xx, 4xx, 5xx, error: no answer, timeout)",
                                       labels=["channel", "consumer", "class"])
        attempt_seconds = HistogramMetricFamily("broker_push_attempt_duration_seconds",
                                                "Push attempt round trip (connect, send, full answer)",
                                                labels=["channel", "consumer"])
        latency = HistogramMetricFamily("broker_delivery_latency_seconds",
                                        "Publish to DELIVERED, per job (push and pull)", labels=["channel", "consumer"])
        for c in consumers:
            counts = job_counts.get(c.pk, {})
            labels = [c.channel.channel_id, c.consumer_id]
            waiters.add_metric(labels, waiting.get(c.pk, 0))
            circuit.add_metric(labels, 1 if c.pk in open_circuits else 0)
            stats = delivery_counts.get(c.pk, {})
            for code, name in dm.OUTCOME_CODES.items():
                attempts.add_metric([*labels, name], stats.get(code, 0))
            buckets, total = dm.histogram(stats, base=dm.ATTEMPT_BUCKET, sum_code=dm.ATTEMPT_SUM,
                                          bounds=dm.ATTEMPT_BOUNDS)
            attempt_seconds.add_metric(labels, buckets, total)
            buckets, total = dm.histogram(stats, base=dm.LATENCY_BUCKET, sum_code=dm.LATENCY_SUM,
                                          bounds=dm.LATENCY_BOUNDS)
            latency.add_metric(labels, buckets, total)
            for status in JobStatus:
                jobs.add_metric([*labels, status.name], counts.get(status.value, 0))
            dead.add_metric(labels, counts.get(JobStatus.DEAD.value, 0))
            backlog.add_metric(labels, counts.get(JobStatus.QUEUED.value, 0))
            inflight.add_metric(labels, counts.get(JobStatus.INFLIGHT.value, 0))
            redelivered.add_metric(labels, counts.get(REDELIVERED, 0))
        messages = GaugeMetricFamily("broker_messages", "Messages per channel", labels=["channel"])
        message_counts = counts_for(scope=MESSAGE)
        channels = list(Channel.objects.only("id", "channel_id", "retention"))
        for ch in channels:
            messages.add_metric([ch.channel_id], sum(message_counts.get(ch.pk, {}).values()))
        plans = GaugeMetricFamily("broker_plan_regressions",
                                  "Hot statements whose last plan check (after an ANALYZE of jobs_job or "
                                  "broker_message, or manage.py broker_plans --store) left their index")
        plans.add_metric([], plan_regressions_count())
        lag = GaugeMetricFamily("broker_push_delivery_lag_seconds",
                                "How long the jobs the push dispatchers claim waited once due, as they last "
                                "reported it (the shortest across consumers of each one's longest; 0 while they "
                                "keep up): what publishing's admission decides from (BROKER_PUBLISH_ADMIT_LAG)")
        lag.add_metric([], deliveries_lag())
        refused = CounterMetricFamily("broker_publish_refused", "Publishes refused at once (503 overloaded) by "
                                      "reason: the push deliveries behind (delivery_lag), the publishing queue's "
                                      "oldest wait (publishing_queue), the web event loop behind (event_loop)",
                                      labels=["reason"])
        for reason, n in publish_refusals_counts().items():
            refused.add_metric([reason], n)
        yield from (jobs, dead, backlog, inflight, redelivered, messages, waiters, circuit, attempts, attempt_seconds,
                    latency, plans, lag, refused)
        yield from footprint_metrics(channels)


def footprint_metrics(channels: list) -> list:
    """Retention (jobs.sweeps.retention): per channel the window in force, the oldest stored message's
    age and the rows removed; the sweep's runs (a histogram of their durations) and its last run.
    One index probe per channel and a few counter rows."""
    window = GaugeMetricFamily("broker_retention_seconds", "Retention in force (the channel's, else "
                               "BROKER_RETENTION)", labels=["channel"])
    oldest_age = GaugeMetricFamily("broker_oldest_message_age_seconds", "Age of the oldest stored message "
                                   "(channels with messages)", labels=["channel"])
    removed = CounterMetricFamily("broker_retention_removed", "Rows removed by retention, by table "
                                  "(messages, jobs, transitions, attempts)", labels=["channel", "table"])
    oldest = retention.oldest_messages(channel_pks=[ch.pk for ch in channels])
    removed_counts = retention.removed_by_channel()
    for ch in channels:
        window.add_metric([ch.channel_id], retention.retention_seconds(ch))
        if oldest.get(ch.pk) is not None and oldest[ch.pk].age is not None:
            oldest_age.add_metric([ch.channel_id], max(oldest[ch.pk].age, 0.0))
        for table in retention.RETENTION_TABLES.values():
            removed.add_metric([ch.channel_id, table], removed_counts.get(ch.pk, {}).get(table, 0))
    runs = retention.run_counts()
    run_total = CounterMetricFamily("broker_retention_runs", "Runs of the retention sweep")
    run_total.add_metric([], runs.get(retention.RUNS, 0))
    durations = HistogramMetricFamily("broker_retention_run_duration_seconds", "Duration of a retention sweep run")
    buckets, total = dm.histogram(runs, base=retention.RUN_BUCKET, sum_code=retention.RUN_SUM,
                                  bounds=retention.RUN_BOUNDS)
    durations.add_metric([], buckets, total)
    last = retention.retention_last_run()
    last_at = GaugeMetricFamily("broker_retention_last_run_timestamp_seconds", "When the retention sweep last "
                                "ran (Unix time; 0: never)")
    last_at.add_metric([], last.started_at.timestamp() if last else 0.0)
    last_seconds = GaugeMetricFamily("broker_retention_last_run_duration_seconds", "How long its last run took")
    last_seconds.add_metric([], last.seconds if last else 0.0)
    return [window, oldest_age, removed, run_total, durations, last_at, last_seconds]


class MetricsView(APIView):
    @extend_schema(summary="Prometheus metrics", responses={200: OpenApiResponse(description="text/plain exposition")})
    def get(self, request):
        registry = CollectorRegistry()
        registry.register(DatabaseCollector())
        registry.register(SourceCollector())  # inbound sources: broker_source_requests_total
        return HttpResponse(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")
