"""The operator's admin site: the index page is the broker dashboard.

``web.apps.BrokerAdminConfig`` (installed in place of ``django.contrib.admin``) names this site,
so ``admin.site`` and every ``@admin.register`` use it. Loaded on first use of ``admin.site``,
once the models are.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.urls import NoReverseMatch, reverse

from broker.durations import duration_format
from jobs.ops.dashboard import dashboard_snapshot, duration_text
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from pipeline.latest import pipeline_report_latest
from web import svg

REFRESH_CHOICES = (0, 15, 60)  # seconds; the page reloads itself with <meta http-equiv="refresh">


class BrokerAdminSite(admin.AdminSite):
    site_header = "Broker administration"
    site_title = "Broker admin"
    index_title = "Dashboard"
    index_template = "broker/dashboard.html"
    site_url = None  # no public site: "/" is the HTTP API

    def index(self, request, extra_context=None):
        dashboard = dashboard_snapshot()
        try:
            refresh = int(request.GET.get("refresh", "0"))
        except ValueError:
            refresh = 0
        consumers = {c.consumer.pk: c for c in dashboard.consumers}
        context = {
            "dashboard": dashboard,
            "alerts": [_alert_row(a, consumers.get(a.consumer_pk)) for a in dashboard.alerts],
            "totals": _totals(dashboard, dashboard.failure_rate),
            "pipeline_report": _pipeline_report(),
            "channel_rows": [_channel_row(ch) for ch in dashboard.channels],
            "retention": _retention(dashboard),
            "main_chart": svg.minute_chart(
                delivered=dashboard.series.delivered, failed=dashboard.series.failed,
                backlog=dashboard.series.backlog(dashboard.total("backlog_now")),
                title="All consumers: attempts per minute, last hour", width=960),
            "refresh": refresh if refresh in REFRESH_CHOICES else 0,
            "refresh_choices": REFRESH_CHOICES[1:],
            **(extra_context or {}),
        }
        return super().index(request, context)


def _totals(source, failure_rate) -> dict:
    """Job counts and rates of a channel or of everything (``source.total``)."""
    return {
        "queued": source.total("queued"), "inflight": source.total("inflight"),
        "delivered": source.total("delivered"), "dead": source.total("dead"),
        "per_minute": source.total("delivered_per_minute"),
        "failure_pct": None if failure_rate is None else round(100 * failure_rate, 1),
    }


def _retention(dashboard) -> dict:
    """The footprint line: when the retention sweep last ran, what it removed, the oldest message."""
    last = dashboard.retention_last_run
    ages = [ch.oldest_message_age for ch in dashboard.channels if ch.oldest_message_age is not None]
    return {
        "last_run_ago": duration_text((dashboard.now - last.started_at).total_seconds()) if last else None,
        "last_run_seconds": last.seconds if last else None,
        "last_run_removed": last.removed if last else 0,
        "removed": dashboard.removed,
        "oldest": duration_text(max(ages)) if ages else None,
    }


def _pipeline_report() -> dict | None:
    """The Spark pipeline's latest report, when its page is wired into the URLs."""
    try:
        url = reverse("pipeline-report-latest")
    except NoReverseMatch:
        return None
    report = pipeline_report_latest()
    return {"url": url, "report": report} if report else None


def _jobs_url(consumer_pk: int | None = None, **params) -> str:
    if consumer_pk is not None:
        params = {"consumer": consumer_pk, **params}
    url = reverse("admin:jobs_job_changelist")
    return f"{url}?{urlencode(params)}" if params else url


# Where an alert's link leads: the jobs that explain it.
_ALERT_FILTERS = {
    "dead": {"status__exact": DEAD},
    "stalled": {"status__exact": QUEUED},
    "backlog": {"status__exact": QUEUED},
    "failing": {"attempts": "1"},
    "overdue": {"status__exact": INFLIGHT},
}


def _alert_row(alert, stats) -> dict:
    where = ""
    if stats is not None:
        where = f"{stats.consumer.channel.channel_id} / {stats.consumer.consumer_id}"
    return {"alert": alert, "where": where,
            "url": _jobs_url(alert.consumer_pk, **_ALERT_FILTERS.get(alert.kind, {}))}


def _channel_row(ch) -> dict:
    return {
        "stats": ch,
        "url": reverse("admin:broker_channel_change", args=[ch.channel.pk]),
        "spark": svg.minute_bars(ch.series.delivered, ch.series.failed, label=ch.channel.channel_id),
        "totals": _totals(ch, ch.failure_rate),
        "consumers": [_consumer_row(c) for c in ch.consumers],
        "retention": duration_format(ch.retention),
        "oldest": duration_text(ch.oldest_message_age) if ch.oldest_message_age is not None else None,
    }


def _consumer_row(c) -> dict:
    pk = c.consumer.pk
    label = f"{c.consumer.channel.channel_id}/{c.consumer.consumer_id}"
    return {
        "stats": c,
        "url": reverse("admin:consumers_consumer_change", args=[pk]),
        "queued_url": _jobs_url(pk, status__exact=QUEUED),
        "inflight_url": _jobs_url(pk, status__exact=INFLIGHT),
        "delivered_url": _jobs_url(pk, status__exact=DELIVERED),
        "dead_url": _jobs_url(pk, status__exact=DEAD),
        "oldest": duration_text(c.oldest_queued_age) if c.oldest_queued_age is not None else "",
        "spark": svg.minute_bars(c.series.delivered, c.series.failed, label=label),
        "backlog_spark": svg.line(c.series.backlog(c.backlog_now), label=f"{label} backlog"),
        "failure_pct": None if c.failure_rate is None else round(100 * c.failure_rate, 1),
    }
