"""Admin for jobs: find them (status, channel, consumer, retries, age), see everything about one
(payload, headers, every attempt, every state change) and act on them (requeue, mark dead, delete
dead) through the job state machine's functions, the same ones the HTTP API calls. The list's
filters are in ``web.admin.job_filters``; the attempt and state-change tables in ``web.admin.history``.

Every field is read-only: a job's status changes only through the status writers (jobs.state.transitions names the moves). The tables are
large, so lists never count them (``LargeTableAdmin``); when the filters are only status,
channel and consumer, the count comes exactly from the maintained counters.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from broker.counters import JOB, counts_for
from broker.models import Message
from broker.xid import job_pk, job_xid
from consumers.models import Consumer
from jobs.models import Job, JobStatus, Partition
from jobs.ops.dashboard import duration_text
from jobs.ops.dead_jobs import jobs_delete_dead, jobs_mark_dead, jobs_requeue_dead
from jobs.state.transitions import DEAD, INFLIGHT, QUEUED, STATUS_NAMES, STATUSES
from web.admin.helpers import ChannelFilter, ViewOnlyAdmin, admin_url
from web.admin.job_detail import attempts_table, history_table, job_payload, message_headers
from web.admin.job_filters import AgeFilter, AttemptsFilter, ConsumerFilter, PriorityGroupFilter
from web.admin.partitions import JobPartitionFilter

logger = logging.getLogger("web.admin.channels")

CHUNK = 5000  # job ids handed to one state-machine call (its statements lock at most this many rows)


def job_admin_url(pk: int) -> str:
    """A job's admin page, addressed by its job ID (the xid the API shows), not the bigint key."""
    return reverse("admin:jobs_job_change", args=[job_xid(pk)])


def status_badge(status: int):
    name = STATUS_NAMES.get(status, str(status))
    return format_html('<span class="status status-{}">{}</span>', name.lower(), name)


def _delta_text(value: timedelta | None, *, future: bool = False) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds()
    if future:
        return "due" if seconds <= 0 else f"in {duration_text(seconds)}"
    return duration_text(seconds)


# --- jobs -----------------------------------------------------------------------------------------------

class JobChangeList(ChangeList):
    def url_for_result(self, result):
        return job_admin_url(result.pk)


@admin.register(Job)
class JobAdmin(ViewOnlyAdmin):
    list_display = ("job_id_col", "status_col", "channel_col", "consumer_col", "message_col", "priority",
                    "retry_count", "age_col", "timing_col")
    list_display_links = ("job_id_col",)
    list_filter = ("status", ChannelFilter, ConsumerFilter, JobPartitionFilter, PriorityGroupFilter, AttemptsFilter,
                   AgeFilter)
    list_select_related = False  # done in get_queryset, with the payload deferred
    search_fields = ("=message__message_id",)  # see get_search_results
    search_help_text = "A job ID, or a message id (exact)."
    actions = ("requeue", "mark_dead", "delete_dead")
    fieldsets = (
        (None, {"fields": ("job_id_col", "status_col", "channel_col", "consumer_col", "message_col", "partition_col",
                           "gate", "priority", "retry_count", "created_at", "status_changed_at", "next_attempt_at", "deadline",
                           "incremental_timeout")}),
        ("Message", {"fields": ("message_content_type", "message_headers", "message_payload")}),
        ("Delivery attempts", {"fields": ("attempts_table",)}),
        ("State changes", {"fields": ("history_table",)}),
    )
    readonly_fields = ("job_id_col", "status_col", "channel_col", "consumer_col", "message_col", "partition_col", "gate",
                       "priority", "retry_count",
                       "created_at", "status_changed_at", "next_attempt_at", "deadline", "incremental_timeout",
                       "message_content_type", "message_headers", "message_payload", "attempts_table",
                       "history_table")

    # Counts that the maintained counters answer exactly; anything else is a capped count.
    COUNTER_PARAMS = {"status__exact", "channel", "consumer"}

    def get_queryset(self, request):
        return (super().get_queryset(request)
                .select_related("channel", "consumer", "message")
                .defer("payload", "message__payload", "message__headers")
                .annotate(has_own_payload=ExpressionWrapper(Q(payload__isnull=False), output_field=BooleanField()),
                          age=ExpressionWrapper(Now() - F("created_at"), output_field=DurationField()),
                          due_in=ExpressionWrapper(F("next_attempt_at") - Now(), output_field=DurationField()),
                          deadline_in=ExpressionWrapper(F("deadline") - Now(), output_field=DurationField())))

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    def get_object(self, request, object_id, from_field=None):
        """Job pages are addressed by job ID; anything else is "doesn't exist"."""
        pk = job_pk(object_id)
        return None if pk is None else super().get_object(request, str(pk), from_field)

    def get_search_results(self, request, queryset, search_term):
        """Exact matches only, each served by an index: the job ID (its primary key), or the
        message id (messages by (channel, message_id), then jobs by message)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        # the message pks first (one per channel at most): a literal list lets the planner OR two
        # index scans, where a subquery made it walk the whole primary key
        message_pks = list(Message.objects.filter(message_id=term).values_list("pk", flat=True)[:1000])
        by_message = Q(message_id__in=message_pks)
        pk = job_pk(term)
        if pk is not None:
            return queryset.filter(Q(pk=pk) | by_message), False
        return queryset.filter(by_message), False

    def exact_count(self, request) -> int | None:
        params = {k: v for k, v in request.GET.items() if k not in self.IGNORED_COUNT_PARAMS}
        if set(params) - self.COUNTER_PARAMS or any(not v.isdigit() for v in params.values()):
            return None

        consumers = Consumer.objects.all()
        if "channel" in params:
            consumers = consumers.filter(channel_id=int(params["channel"]))
        if "consumer" in params:
            consumers = consumers.filter(pk=int(params["consumer"]))
        pks = list(consumers.values_list("pk", flat=True)[:10_001])
        if len(pks) > 10_000:
            return None
        statuses = [int(params["status__exact"])] if "status__exact" in params else list(STATUSES)
        counts = counts_for(scope=JOB, owner_ids=pks)
        return max(sum(counts.get(pk, {}).get(s, 0) for pk in pks for s in statuses), 0)

    def get_ordering(self, request):
        """One consumer's jobs in one status are read off the index of that status in its order
        (job_claim (consumer, id) for QUEUED, walked backwards; job_consumer_status (consumer,
        status, id DESC) for finished jobs): ordered by id alone, the planner walked the primary key
        over every other consumer's jobs to fill a page (ConsumerFilter filters by a range, so the
        consumer stays a sort key the index provides)."""
        if request.GET.get("consumer", "").isdigit() and request.GET.get("status__exact", "").isdigit():
            if int(request.GET["status__exact"]) == JobStatus.QUEUED:
                return ("-consumer_id", "-id")
            return ("consumer_id", "-id")
        return super().get_ordering(request)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # only dead jobs are deleted, by the "delete dead" action

    def has_delete_dead_permission(self, request):
        return request.user.has_perm("jobs.delete_job")

    def save_model(self, request, obj, form, change):
        """Nothing on a job is edited here: never write the row (a stale status could be saved)."""

    def changelist_view(self, request, extra_context=None):
        title = "Dead jobs" if request.GET.get("status__exact") == str(DEAD) else "Jobs"
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def page_context(self, request, object_id) -> dict:
        return {"can_act": self.has_change_permission(request),
                "can_delete_dead": self.has_delete_dead_permission(request), "title": "Job", "job_xid": object_id}

    # columns

    @admin.display(description="ID", ordering="id")
    def job_id_col(self, obj):
        return job_xid(obj.pk)

    @admin.display(description="status")
    def status_col(self, obj):
        return status_badge(obj.status)

    @admin.display(description="partition")
    def partition_col(self, obj):
        if obj.partition_id is None:
            return "—"

        key = Partition.objects.filter(pk=obj.partition_id).values_list("key", flat=True).first()
        if key is None:
            return f"#{obj.partition_id}"
        return format_html('<a href="{}">{}</a>', reverse("admin:jobs_partition_change", args=[obj.partition_id]), key)

    @admin.display(description="channel")
    def channel_col(self, obj):
        return obj.channel.channel_id

    @admin.display(description="consumer")
    def consumer_col(self, obj):
        return format_html('<a href="{}">{}</a>', admin_url(obj.consumer), obj.consumer.consumer_id)

    @admin.display(description="message")
    def message_col(self, obj):
        return format_html('<a href="{}">{}</a>', admin_url(obj.message),
                           Truncator(obj.message.message_id).chars(40))

    @admin.display(description="age")
    def age_col(self, obj):
        return _delta_text(getattr(obj, "age", None))

    @admin.display(description="due / deadline")
    def timing_col(self, obj):
        if obj.status == QUEUED:
            return _delta_text(getattr(obj, "due_in", None), future=True)
        if obj.status == INFLIGHT:
            left = getattr(obj, "deadline_in", None)
            if left is None:
                return ""
            seconds = left.total_seconds()
            return f"deadline in {duration_text(seconds)}" if seconds >= 0 else f"overdue {duration_text(-seconds)}"
        return ""

    @admin.display(description="content type")
    def message_content_type(self, obj):
        return obj.message.content_type

    @admin.display(description="headers")
    def message_headers(self, obj):
        return message_headers(obj.message_id)

    @admin.display(description="payload")
    def message_payload(self, obj):
        return job_payload(job_pk=obj.pk, message_pk=obj.message_id, own=obj.has_own_payload)

    @admin.display(description="attempts")
    def attempts_table(self, obj):
        return attempts_table(obj.pk)

    @admin.display(description="history")
    def history_table(self, obj):
        return history_table(obj.pk)

    # actions: each calls the state machine and says what it did

    @admin.action(description="Requeue selected dead jobs", permissions=["change"])
    def requeue(self, request, queryset):
        selected = _selected_count(request, queryset)
        moved = sum(jobs_requeue_dead(consumer_pk=consumer, job_ids=ids, reason="admin-requeue")
                    for consumer, ids in _dead_chunks(queryset))
        self._report(request, selected, moved, f"Requeued {moved:,} dead job{_s(moved)}.",
                     "not dead (only dead jobs are requeued)")

    @admin.action(description="Mark selected queued / in-flight jobs dead", permissions=["change"])
    def mark_dead(self, request, queryset):
        selected = _selected_count(request, queryset)
        moved: dict[int, int] = {}
        for ids in _id_chunks(queryset.filter(status__in=[QUEUED, INFLIGHT])):
            moved.update(jobs_mark_dead(job_ids=ids, reason="admin-mark-dead"))
        queued = sum(1 for s in moved.values() if s == QUEUED)
        text = (f"Marked {len(moved):,} job{_s(len(moved))} dead "
                f"({queued:,} were queued, {len(moved) - queued:,} in flight).")
        self._report(request, selected, len(moved), text, "already delivered or dead")

    @admin.action(description="Delete selected dead jobs", permissions=["delete_dead"])
    def delete_dead(self, request, queryset):
        selected = _selected_count(request, queryset)
        deleted = sum(jobs_delete_dead(consumer_pk=consumer, job_ids=ids)
                      for consumer, ids in _dead_chunks(queryset))
        self._report(request, selected, deleted, f"Deleted {deleted:,} dead job{_s(deleted)}.",
                     "not dead (only dead jobs are deleted)")

    def _report(self, request, selected: int | None, done: int, text: str, why_skipped: str) -> None:
        logger.info("admin user %s: %s", request.user.get_username(), text)  # the audit trail: who did what
        if selected is not None:
            skipped = selected - done
            if skipped > 0:
                text += f" {skipped:,} selected job{_s(skipped)} left alone: {why_skipped}."
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)

    # one-job buttons on the job's page

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/requeue/", view(self.job_action_view), {"action": "requeue"},
                 name="jobs_job_requeue"),
            path("<path:object_id>/mark-dead/", view(self.job_action_view), {"action": "mark_dead"},
                 name="jobs_job_mark_dead"),
            path("<path:object_id>/delete-dead/", view(self.job_action_view), {"action": "delete_dead"},
                 name="jobs_job_delete_dead"),
            *super().get_urls(),
        ]

    def job_action_view(self, request, object_id: str, action: str):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        allowed = (self.has_delete_dead_permission(request) if action == "delete_dead"
                   else self.has_change_permission(request))
        if not allowed:
            raise PermissionDenied
        job = get_object_or_404(Job.objects.only("pk"), pk=job_pk(object_id) or -1)
        getattr(self, action)(request, Job.objects.filter(pk=job.pk))
        if action == "delete_dead" and not Job.objects.filter(pk=job.pk).exists():
            return HttpResponseRedirect(reverse("admin:jobs_job_changelist"))
        return HttpResponseRedirect(job_admin_url(job.pk))


def _selected_count(request, queryset) -> int | None:
    """How many jobs an explicit selection holds (a page at most); None for "select all", which
    may be millions and is not counted."""
    return None if request.POST.get("select_across") == "1" else queryset.count()


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _id_chunks(queryset):
    """The ids of ``queryset`` in lists of at most CHUNK, streamed (a select-across may be millions)."""
    chunk: list[int] = []
    for pk in queryset.order_by().values_list("pk", flat=True).iterator(chunk_size=CHUNK):
        chunk.append(pk)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _dead_chunks(queryset):
    """(consumer pk, [dead job ids]) batches of ``queryset``: the DLQ functions work per consumer."""
    pending: dict[int, list[int]] = defaultdict(list)
    rows = queryset.filter(status=DEAD).order_by().values_list("consumer_id", "pk")
    for consumer, pk in rows.iterator(chunk_size=CHUNK):
        pending[consumer].append(pk)
        if len(pending[consumer]) >= CHUNK:
            yield consumer, pending.pop(consumer)
    yield from pending.items()

