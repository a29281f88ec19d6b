"""Prometheus metrics. Gauges are read from the database at scrape time, so they are correct
whatever number of web processes and worker clusters run."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from rest_framework.views import APIView

from broker.counters import JOB, MESSAGE, REDELIVERED, counts_for


class DatabaseCollector:
    """Backlog, in-flight, delivered and dead jobs per channel and consumer."""

    def collect(self):
        from broker.models import Channel
        from consumers.models import Consumer
        from jobs.models import JobStatus

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
        for c in consumers:
            counts = job_counts.get(c.pk, {})
            labels = [c.channel.channel_id, c.consumer_id]
            for status in JobStatus:
                jobs.add_metric([*labels, status.name], counts.get(status.value, 0))
            dead.add_metric(labels, counts.get(JobStatus.DEAD.value, 0))
            backlog.add_metric(labels, counts.get(JobStatus.QUEUED.value, 0))
            inflight.add_metric(labels, counts.get(JobStatus.INFLIGHT.value, 0))
            redelivered.add_metric(labels, counts.get(REDELIVERED, 0))
        messages = GaugeMetricFamily("broker_messages", "Messages per channel", labels=["channel"])
        message_counts = counts_for(scope=MESSAGE)
        for ch in Channel.objects.only("id", "channel_id"):
            messages.add_metric([ch.channel_id], sum(message_counts.get(ch.pk, {}).values()))
        yield from (jobs, dead, backlog, inflight, redelivered, messages)


class MetricsView(APIView):
    @extend_schema(summary="Prometheus metrics", responses={200: OpenApiResponse(description="text/plain exposition")})
    def get(self, request):
        registry = CollectorRegistry()
        registry.register(DatabaseCollector())
        return HttpResponse(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")
