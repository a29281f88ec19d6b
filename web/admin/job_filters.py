"""The job list's own filters (consumer, retries, age, priority group): their choices are fixed or
read from the small consumer table, never from a scan of the jobs table."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now

from consumers.models import Consumer
from web.admin.helpers import NumberFilter


class ConsumerFilter(NumberFilter):
    title = "consumer"
    parameter_name = "consumer"

    def lookups(self, request, model_admin):
        consumers = Consumer.objects.order_by("channel__channel_id", "consumer_id")
        channel = request.GET.get("channel", "")
        if channel.isdigit():
            consumers = consumers.filter(channel_id=int(channel))
        return [(pk, f"{ch} / {c}") for pk, ch, c in
                consumers.values_list("pk", "channel__channel_id", "consumer_id")[:500]]

    def filter_number(self, queryset, n: int):
        # a range, not an equality: the consumer stays a sort key (JobAdmin.get_ordering)
        return queryset.filter(consumer_id__gte=n, consumer_id__lte=n)


class AttemptsFilter(NumberFilter):
    title = "retries"
    parameter_name = "attempts"

    def lookups(self, request, model_admin):
        return [("0", "none"), ("1", "1 or more"), ("3", "3 or more"), ("5", "5 or more"), ("10", "10 or more")]

    def filter_number(self, queryset, n: int):
        return queryset.filter(retry_count=0) if n == 0 else queryset.filter(retry_count__gte=n)


class AgeFilter(admin.SimpleListFilter):
    """Age of the job (since it was created), by the database clock."""

    title = "age"
    parameter_name = "age"
    CHOICES = {
        "lt5m": ("younger than 5 minutes", "gte", timedelta(minutes=5)),
        "lt1h": ("younger than 1 hour", "gte", timedelta(hours=1)),
        "lt24h": ("younger than 24 hours", "gte", timedelta(hours=24)),
        "gt1h": ("older than 1 hour", "lt", timedelta(hours=1)),
        "gt24h": ("older than 24 hours", "lt", timedelta(hours=24)),
        "gt7d": ("older than 7 days", "lt", timedelta(days=7)),
    }

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _, _) in self.CHOICES.items()]

    def queryset(self, request, queryset):
        choice = self.CHOICES.get(self.value() or "")
        if choice is None:
            return queryset if self.value() is None else queryset.none()
        _, op, age = choice
        boundary = ExpressionWrapper(Now() - age, output_field=DateTimeField())
        return queryset.filter(**{f"created_at__{op}": boundary})


class PriorityGroupFilter(admin.SimpleListFilter):
    """Jobs of the pull consumers that serve a priority group (from the small consumer table,
    so the job query stays a ``consumer_id IN (...)`` on an index)."""

    title = "priority group"
    parameter_name = "group"

    def lookups(self, request, model_admin):
        names = set()
        for groups in Consumer.objects.exclude(priority_groups=[]).values_list("priority_groups", flat=True):
            names.update(groups or [])
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset

        pks = Consumer.objects.filter(priority_groups__contains=[self.value()]).values_list("pk", flat=True)
        return queryset.filter(consumer_id__in=list(pks))
