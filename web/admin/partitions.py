"""Admin for partitions: where each partition stands (gate, status, lease, jobs per gate) and the
operator's actions (advance, retry, skip, close), which call the same ``jobs.partitions`` service
functions as the HTTP API. Every field is read-only: a partition changes only through those
functions (versioned writes), never through a saved form.
"""

from __future__ import annotations

import logging

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Now
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from broker.errors import DomainError
from consumers.models import Consumer
from jobs.models import Job, Partition, PartitionStatus
from jobs.ops.partition_actions import partition_advance, partition_close, partition_retry, partition_skip
from jobs.partitions.rows import partition_get
from web.admin.helpers import ViewOnlyAdmin, admin_url, changelist_url, table

logger = logging.getLogger("web.admin.channels")

ACTIONS = {
    # action name: (service function, past tense for the report)
    "advance": (partition_advance, "advanced"),
    "retry": (partition_retry, "retried"),
    "skip": (partition_skip, "skipped"),
    "close": (partition_close, "closed"),
}


class PartitionConsumerFilter(admin.SimpleListFilter):
    title = "consumer"
    parameter_name = "consumer"

    def lookups(self, request, model_admin):
        return [(pk, f"{ch} / {c}") for pk, ch, c in Consumer.objects.order_by("channel__channel_id", "consumer_id")
                .values_list("pk", "channel__channel_id", "consumer_id")[:500]]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(consumer_id=int(value)) if value.isdigit() else queryset.none()


class LeaseFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("held", "held"), ("expired", "expired"), ("free", "free")]

    def queryset(self, request, queryset):
        if self.value() == "held":
            return queryset.exclude(owner="").filter(lease_until__gt=Now())
        if self.value() == "expired":
            return queryset.exclude(owner="").filter(lease_until__lte=Now())
        if self.value() == "free":
            return queryset.filter(owner="")
        return queryset


def status_badge(status: int):
    name = PartitionStatus(status).name if status in PartitionStatus.values else str(status)
    return format_html('<span class="status status-{}">{}</span>', name.lower(), name)


@admin.register(Partition)
class PartitionAdmin(ViewOnlyAdmin):
    list_display = ("key", "status_col", "gate", "consumer_col", "closed", "auto_close", "manual_checkpoint",
                    "owner_col", "lease_until", "updated_at")
    list_filter = ("status", PartitionConsumerFilter, LeaseFilter, "closed", "manual_checkpoint")
    search_fields = ("=key",)
    search_help_text = "A partition key (exact)."
    actions = ("advance", "retry", "skip", "close")
    readonly_fields = ("key", "status_col", "gate", "consumer_col", "closed", "auto_close", "manual_checkpoint",
                       "owner_col", "lease_until", "version", "created_at", "updated_at", "gates_table", "jobs_link")
    fieldsets = (
        (None, {"fields": ("key", "status_col", "gate", "consumer_col", "closed", "auto_close",
                           "manual_checkpoint", "version", "created_at", "updated_at")}),
        ("Lease", {"fields": ("owner_col", "lease_until")}),
        ("Jobs per gate", {"fields": ("gates_table", "jobs_link")}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("consumer", "consumer__channel")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        """Never write the row from a form: every change is a versioned write in jobs.partitions."""

    def page_context(self, request, object_id) -> dict:
        actions = [(name, name.capitalize()) for name in ACTIONS] if self.has_change_permission(request) else []
        return {"title": "Partition", "partition_actions": actions}

    # columns

    @admin.display(description="status", ordering="status")
    def status_col(self, obj):
        return status_badge(obj.status)

    @admin.display(description="consumer")
    def consumer_col(self, obj):
        return format_html('<a href="{}">{} / {}</a>', admin_url(obj.consumer), obj.consumer.channel.channel_id,
                           obj.consumer.consumer_id)

    @admin.display(description="owner")
    def owner_col(self, obj):
        return obj.owner or "—"

    @admin.display(description="jobs at each gate")
    def gates_table(self, obj):
        body = partition_get(partition_pk=obj.pk)
        names = ["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"]
        rows = [[format_html("<b>{}</b>", gate) if str(obj.gate) == gate else gate,
                 *[counts.get(name, 0) for name in names]]
                for gate, counts in sorted(body["counts"].items(), key=lambda kv: int(kv[0]))]
        return table(["gate", *[n.lower() for n in names]], rows, empty="No jobs")

    @admin.display(description="jobs")
    def jobs_link(self, obj):
        return format_html('<a href="{}">Jobs of this partition</a>', changelist_url(Job, partition=obj.pk))

    # actions: each calls the partition service function and says what it did

    def _run(self, request, queryset, action: str) -> None:
        func, done_word = ACTIONS[action]
        done, refused = [], []
        for pk, key in queryset.values_list("pk", "key")[:500]:
            try:
                body = func(partition_pk=pk)
            except DomainError as exc:
                refused.append(f"{key}: {exc.detail}")
                continue
            extra = {"retry": "requeued", "skip": "skipped"}.get(action)
            done.append(f"{key}" + (f" ({body.get(extra, 0)} job{'s' if body.get(extra, 0) != 1 else ''} {extra})"
                                    if extra else "") + f" now {body['status']} at gate {body['gate']}")
        if done:
            text = f"{done_word.capitalize()} {len(done)} partition{'s' if len(done) != 1 else ''}: " + "; ".join(done)
            logger.info("admin user %s: %s", request.user.get_username(), text)  # audit trail
            self.message_user(request, text, messages.SUCCESS)
        if refused:
            self.message_user(request, f"Not {done_word}: " + "; ".join(refused), messages.WARNING)

    @admin.action(description="Advance selected partitions to their next gate (manual checkpoint)",
                  permissions=["change"])
    def advance(self, request, queryset):
        self._run(request, queryset, "advance")

    @admin.action(description="Retry selected partitions (requeue their dead jobs)", permissions=["change"])
    def retry(self, request, queryset):
        self._run(request, queryset, "retry")

    @admin.action(description="Skip the dead jobs at the current gate of selected partitions", permissions=["change"])
    def skip(self, request, queryset):
        self._run(request, queryset, "skip")

    @admin.action(description="Close selected partitions (no more items)", permissions=["change"])
    def close(self, request, queryset):
        self._run(request, queryset, "close")

    # one-partition buttons on its page

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/act/<str:action>/", view(self.partition_action_view),
                 name="jobs_partition_action"),
            *super().get_urls(),
        ]

    def partition_action_view(self, request, object_id: str, action: str):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if action not in ACTIONS:
            return HttpResponseRedirect(reverse("admin:jobs_partition_changelist"))
        if not self.has_change_permission(request):
            raise PermissionDenied
        obj = get_object_or_404(Partition.objects.only("pk"), pk=object_id if str(object_id).isdigit() else -1)
        self._run(request, Partition.objects.filter(pk=obj.pk), action)
        return HttpResponseRedirect(reverse("admin:jobs_partition_change", args=[obj.pk]))


class JobPartitionFilter(admin.SimpleListFilter):
    """Jobs of one partition (by the partition's pk, as linked from its page), or of any partition."""

    title = "partition"
    parameter_name = "partition"

    def lookups(self, request, model_admin):
        choices = [("any", "any partition"), ("none", "no partition")]
        value = request.GET.get(self.parameter_name, "")
        if value.isdigit():
            key = Partition.objects.filter(pk=int(value)).values_list("key", flat=True).first()
            if key is not None:
                choices.append((value, key))
        return choices

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value == "any":
            return queryset.filter(partition_id__isnull=False)
        if value == "none":
            return queryset.filter(partition_id__isnull=True)
        return queryset.filter(partition_id=int(value)) if value.isdigit() else queryset.none()
