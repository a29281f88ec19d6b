"""Admin for the delivery history tables, read-only: every delivery attempt and every job state
change, filtered by outcome, status code, target status and age, found by job ID, each row linking
to its job's page."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from django.utils.html import format_html
from django.utils.text import Truncator

from broker.xid import job_pk, job_xid
from jobs.models import DeliveryAttempt, JobStatus, JobTransition
from web.admin.helpers import ReadOnlyAdmin
from web.admin.jobs import job_admin_url, status_badge


class RecentFilter(admin.SimpleListFilter):
    title = "when"
    parameter_name = "recent"
    field = "at"

    def lookups(self, request, model_admin):
        return [("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days")]

    def queryset(self, request, queryset):
        spans = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
        if self.value() is None:
            return queryset
        if self.value() not in spans:
            return queryset.none()
        boundary = ExpressionWrapper(Now() - spans[self.value()], output_field=DateTimeField())
        return queryset.filter(**{f"{self.field}__gte": boundary})


class AttemptRecentFilter(RecentFilter):
    field = "started_at"


class OutcomeFilter(admin.SimpleListFilter):
    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request, model_admin):
        return [(o, o) for o in ("delivered", "failed", "timeout", "error", "gone")]

    def queryset(self, request, queryset):
        return queryset if self.value() is None else queryset.filter(outcome=self.value())


class StatusClassFilter(admin.SimpleListFilter):
    title = "status code"
    parameter_name = "code"

    def lookups(self, request, model_admin):
        return [("2", "2xx"), ("3", "3xx"), ("4", "4xx"), ("5", "5xx"), ("none", "no response")]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value == "none":
            return queryset.filter(status_code__isnull=True)
        if value in ("2", "3", "4", "5"):
            low = int(value) * 100
            return queryset.filter(status_code__gte=low, status_code__lt=low + 100)
        return queryset.none()


class ToStatusFilter(admin.SimpleListFilter):
    """Fixed choices: the default filter would run SELECT DISTINCT over the whole history table."""

    title = "to status"
    parameter_name = "to"

    def lookups(self, request, model_admin):
        return [(str(s.value), s.name) for s in JobStatus]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(to_status=int(value)) if value.isdigit() else queryset.none()


def _job_link(job_id: int):
    return format_html('<a href="{}">{}</a>', job_admin_url(job_id), job_xid(job_id))


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_col", "attempt", "started_at", "status_code", "duration_col", "outcome", "error_col")
    list_filter = (OutcomeFilter, StatusClassFilter, AttemptRecentFilter)
    search_fields = ("=job_id",)
    search_help_text = "A job ID."

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        pk = job_pk(term)
        return (queryset.filter(job_id=pk) if pk is not None else queryset.none()), False

    @admin.display(description="job")
    def job_col(self, obj):
        return _job_link(obj.job_id)

    @admin.display(description="duration")
    def duration_col(self, obj):
        return "" if obj.duration_ms is None else f"{obj.duration_ms:,.1f} ms"

    @admin.display(description="error / response")
    def error_col(self, obj):
        return Truncator(obj.error or obj.response_excerpt).chars(80)


@admin.register(JobTransition)
class JobTransitionAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_col", "from_col", "to_col", "retry_count", "reason", "at")
    list_filter = (ToStatusFilter, RecentFilter)
    search_fields = ("=job_id",)
    search_help_text = "A job ID."
    get_search_results = DeliveryAttemptAdmin.get_search_results

    @admin.display(description="job")
    def job_col(self, obj):
        return _job_link(obj.job_id)

    @admin.display(description="from")
    def from_col(self, obj):
        return status_badge(obj.from_status) if obj.from_status else "(created)"

    @admin.display(description="to")
    def to_col(self, obj):
        return status_badge(obj.to_status)
