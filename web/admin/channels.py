"""Admin for channels, producers, messages and scheduled messages.

Tokens are masked everywhere (last four characters at most); a new one can be set, never read
back. Channel and producer saves go through ``broker.registry`` (the API's upserts, with
the form's load time as If-Unmodified-Since); messages are read-only; cancelling a scheduled
message calls ``jobs.publish.scheduled.scheduled_message_cancel``, as ``DELETE .../scheduled-message/..``.
"""

from __future__ import annotations

import logging

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Func, IntegerField
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import http_date
from django.utils.text import Truncator

from broker.counters import JOB, MESSAGE, counter_column, counts_for
from broker.durations import duration_format, retention_parse
from broker.errors import DomainError, PreconditionFailed
from broker.models import Channel, Message, Producer, ScheduledMessage
from broker.registry import Precondition, channel_upsert, producer_upsert
from broker.xid import job_xid
from consumers.models import Consumer
from eventtypes.rules import mode_parse
from eventtypes.services import event_types_list
from eventtypes.validation import rules_changed
from jobs.models import Job
from jobs.ops.dashboard import SCHEDULED_SCOPE
from jobs.publish.scheduled import scheduled_message_cancel
from jobs.sweeps.retention import channel_footprint
from jobs.state.transitions import DEAD, INFLIGHT, QUEUED
from web.admin.helpers import (ChannelFilter, ReadOnlyAdmin, ServiceFormAdmin, ViewOnlyAdmin, admin_url,
                               changelist_url, json_block, mask, payload_preview, table, url_id_validator)
from web.admin.jobs import job_admin_url, status_badge
from web.admin.sources import sources_of_channel_table

logger = logging.getLogger("web.admin.channels")

# --- channels and producers ---------------------------------------------------------------------------

class RegistryForm(forms.ModelForm):
    """name + a write-only new token; ``loaded_at`` carries the row's Last-Modified for the update."""

    new_token = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current token (a new one is generated on creation).")
    loaded_at = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for key in ("channel_id", "producer_id"):
            if key in self.fields:
                self.fields[key].validators.append(url_id_validator)
        if self.instance.pk and "loaded_at" in self.fields:
            self.fields["loaded_at"].initial = int(self.instance.updated_at.timestamp())
        if "name" in self.fields:
            self.fields["name"].required = False


class ChannelForm(RegistryForm):
    event_types_mode = forms.ChoiceField(
        label="Event types", required=False, choices=[("open", "open"), ("closed", "closed")],
        help_text="open: a message whose type has no event type passes; closed: it is refused (422).")
    retention_text = forms.CharField(
        label="Retention", required=False, strip=True,
        help_text="How long a message whose jobs are all finished stays stored: 90s, 15m, 12h, 7d "
                  "(empty: BROKER_RETENTION). It is also the window in which a message id is refused again.")

    class Meta:
        model = Channel
        fields = ("channel_id", "name")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and self.instance.retention is not None:
            self.fields["retention_text"].initial = duration_format(self.instance.retention)
        self.fields["event_types_mode"].initial = self.instance.event_types if self.instance.pk else "open"

    def clean_retention_text(self):
        try:  # the PUT's rules (broker.durations)
            return retention_parse(self.cleaned_data.get("retention_text"))
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None


class ProducerForm(RegistryForm):
    class Meta:
        model = Producer
        fields = ("producer_id", "name", "rate_limit_per_second", "burst")
        help_texts = {"rate_limit_per_second": "Flow control: messages per second (empty: no limit).",
                      "burst": "Token bucket size (empty: max(1, rate))."}


class RegistryAdmin(ServiceFormAdmin):
    key_field = ""
    upsert = staticmethod(lambda **kw: None)
    show_facets = admin.ShowFacets.NEVER

    def get_fields(self, request, obj=None):
        if obj is None:
            return (self.key_field, "name", "new_token")
        return (self.key_field, "name", "token_col", "new_token", "created_at", "updated_at", *self.extra_fields,
                "loaded_at")

    extra_fields: tuple = ()

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return (self.key_field, "token_col", "created_at", "updated_at", *self.extra_fields)

    def has_delete_permission(self, request, obj=None):
        return False  # the API has no delete for these either; consumers and messages refer to them

    @admin.display(description="token")
    def token_col(self, obj):
        return mask(obj.token)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            precondition = Precondition(http_date(data.get("loaded_at") or int(form.instance.updated_at.timestamp())))
        else:
            precondition = Precondition(None)
        try:
            saved, _ = self.upsert(**{self.key_field: getattr(obj, self.key_field)}, name=data.get("name") or None,
                                   token=data.get("new_token") or None, precondition=precondition,
                                   **self.upsert_extra(data))
        except DomainError as exc:
            if isinstance(exc, PreconditionFailed):
                raise self.refused(PreconditionFailed(exc.code, f"the {self.model._meta.verbose_name} was changed by "
                                   "someone else since you opened this page; reload it and try again")) from None
            raise self.refused(exc) from None
        obj.pk = saved.pk
        obj.updated_at = saved.updated_at

    def upsert_extra(self, data) -> dict:
        """Extra keyword arguments of ``upsert`` from the form (none by default)."""
        return {}

    def save_related(self, request, form, formsets, change):
        """No related objects are edited here."""


@admin.register(Channel)
class ChannelAdmin(RegistryAdmin):
    form = ChannelForm
    key_field = "channel_id"
    upsert = staticmethod(channel_upsert)
    extra_fields = ("footprint", "consumers_table", "event_types_table", "sources_table")
    list_display = ("channel_id", "name", "token_col", "consumers_col", "messages_col", "scheduled_col", "created_at")
    search_fields = ("channel_id", "name")
    ordering = ("channel_id",)

    def get_fields(self, request, obj=None):
        fields = list(super().get_fields(request, obj))
        fields.insert(fields.index("new_token") + 1, "retention_text")
        fields.insert(fields.index("retention_text") + 1, "event_types_mode")
        return tuple(fields)

    def upsert_extra(self, data) -> dict:
        mode = mode_parse(data.get("event_types_mode"))
        return {"settings": {"retention": data.get("retention_text"), **({"event_types": mode} if mode else {})}}

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        rules_changed()  # the channel's eventTypes: this process's publishes see it at once

    @admin.display(description="event types")
    def event_types_table(self, obj):
        """The channel's event types (issue 37), each linked to its page."""
        rows = [[format_html('<a href="{}">{}</a>', admin_url(t), t.name), t.version, "yes" if t.deprecated else "",
                 Truncator(t.description).chars(80)] for t in event_types_list(channel_pks=[obj.pk])]
        return table(["event type", "version", "deprecated", "description"], rows, empty="No event types.")

    @admin.display(description="footprint")
    def footprint(self, obj):
        """What GET /channel/.. reports as Footprint (retention)."""
        f = channel_footprint(channel=obj)
        removed = f["RemovedByRetention"]
        return table(["retention", "oldest stored message", "removed by retention", "retention last ran"], [[
            f["Retention"] + ("" if obj.retention is not None else " (BROKER_RETENTION)"),
            f"{f['OldestMessageAt'] or '-'}",
            f"{removed['Messages']:,} messages, {removed['Jobs']:,} jobs, {removed['Transitions']:,} state "
            f"changes, {removed['Attempts']:,} attempts",
            f["RetentionLastRunAt"] or "never"]])

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            n_consumers=Count("consumers"),
            n_messages=counter_column(owner="channel", scope=MESSAGE),
            n_scheduled=counter_column(owner="channel", scope=SCHEDULED_SCOPE,
                                       status=ScheduledMessage.Status.SCHEDULED))

    @admin.display(description="consumers", ordering="n_consumers")
    def consumers_col(self, obj):
        return format_html('<a href="{}">{}</a>', changelist_url(Consumer, channel__id__exact=obj.pk),
                           obj.n_consumers)

    @admin.display(description="messages", ordering="n_messages")
    def messages_col(self, obj):
        return format_html('<a href="{}">{}</a>', changelist_url(Message, channel=obj.pk), f"{obj.n_messages:,}")

    @admin.display(description="scheduled", ordering="n_scheduled")
    def scheduled_col(self, obj):
        return format_html('<a href="{}">{}</a>', changelist_url(ScheduledMessage, channel=obj.pk,
                                                                 status__exact=ScheduledMessage.Status.SCHEDULED),
                           f"{obj.n_scheduled:,}")

    @admin.display(description="consumers")
    def consumers_table(self, obj):
        consumers = list(Consumer.objects.filter(channel=obj).order_by("consumer_id"))
        counts = counts_for(scope=JOB, owner_ids=[c.pk for c in consumers])
        rows = []
        for c in consumers:
            n = counts.get(c.pk, {})
            rows.append([
                format_html('<a href="{}">{}</a>', admin_url(c), c.consumer_id), c.type,
                f"{n.get(QUEUED, 0):,}", f"{n.get(INFLIGHT, 0):,}",
                format_html('<a href="{}">{}</a>', changelist_url(Job, consumer=c.pk, status__exact=DEAD),
                            f"{n.get(DEAD, 0):,}"),
            ])
        return table(["consumer", "type", "queued", "in flight", "dead"], rows, empty="No consumers.")

    @admin.display(description="inbound sources")
    def sources_table(self, obj):
        return sources_of_channel_table(obj)


@admin.register(Producer)
class ProducerAdmin(RegistryAdmin):
    form = ProducerForm
    key_field = "producer_id"
    upsert = staticmethod(producer_upsert)
    list_display = ("producer_id", "name", "rate_limit_per_second", "burst", "token_col", "created_at")

    def upsert_extra(self, data) -> dict:
        rate = data.get("rate_limit_per_second")
        return {"rate": {"rate_limit_per_second": rate or None, "burst": data.get("burst")}}
    search_fields = ("producer_id", "name")
    ordering = ("producer_id",)


# --- messages (read-only) --------------------------------------------------------------------------

class MessageColumnsMixin:
    """Channel, producer, headers and payload columns of a message or a scheduled message (headers
    and payload read one row at a time: the list query defers them and reads only their size)."""

    def get_queryset(self, request):
        size = Func(F("payload"), function="octet_length", output_field=IntegerField())
        return super().get_queryset(request).select_related("channel", "producer").defer("payload").annotate(size=size)

    def has_add_permission(self, request):
        return False

    @admin.display(description="size")
    def size_col(self, obj):
        size = getattr(obj, "size", None)
        return "" if size is None else f"{size:,} B"

    @admin.display(description="channel")
    def channel_col(self, obj):
        return obj.channel.channel_id

    @admin.display(description="producer")
    def producer_col(self, obj):
        return obj.producer.producer_id

    @admin.display(description="headers")
    def headers_col(self, obj):
        return json_block(self.model.objects.filter(pk=obj.pk).values_list("headers", flat=True).first())

    @admin.display(description="payload")
    def payload_col(self, obj):
        return payload_preview(table=self.model._meta.db_table, pk=obj.pk)


@admin.register(Message)
class MessageAdmin(MessageColumnsMixin, ReadOnlyAdmin):
    channel_counter_scope = MESSAGE
    list_display = ("id", "message_col", "channel_col", "producer_col", "status", "priority", "size_col", "received_at")
    list_display_links = ("id",)
    list_filter = (ChannelFilter, "status")
    search_fields = ("=message_id",)
    search_help_text = "A message id (exact)."
    fields = ("id", "message_id", "channel_col", "producer_col", "status", "priority", "content_type", "received_at",
              "dispatched_at", "headers_col", "payload_col", "jobs_table")
    readonly_fields = fields

    @admin.display(description="message id")
    def message_col(self, obj):
        return Truncator(obj.message_id).chars(60)

    @admin.display(description="jobs")
    def jobs_table(self, obj):
        jobs = Job.objects.filter(message_id=obj.pk).select_related("consumer").order_by("consumer__consumer_id")[:500]
        return table(["job", "consumer", "status", "retries", "status changed"],
                     [[format_html('<a href="{}">{}</a>', job_admin_url(j.pk), job_xid(j.pk)), j.consumer.consumer_id,
                       status_badge(j.status), j.retry_count, f"{j.status_changed_at:%Y-%m-%d %H:%M:%S}"]
                      for j in jobs], empty="No jobs (no consumer, or not dispatched yet).")


# --- scheduled messages ------------------------------------------------------------------------------

@admin.register(ScheduledMessage)
class ScheduledMessageAdmin(MessageColumnsMixin, ViewOnlyAdmin):
    channel_counter_scope = SCHEDULED_SCOPE
    list_display = ("id", "message_id", "channel_col", "producer_col", "status", "dispatch_at", "size_col",
                    "dispatched_at", "error")
    list_display_links = ("id",)
    list_filter = (ChannelFilter, "status")
    search_fields = ("=message_id",)
    search_help_text = "A message id (exact)."
    actions = ("cancel",)
    fields = ("id", "message_id", "channel_col", "producer_col", "status", "priority", "content_type",
              "dispatch_at", "created_at", "dispatched_at", "error", "headers_col", "payload_col")
    readonly_fields = fields
    sortable_by = ("id", "dispatch_at")

    def has_delete_permission(self, request, obj=None):
        return False  # cancel is the way to remove one (only while it is still scheduled)

    def save_model(self, request, obj, form, change):
        """Nothing is edited here."""

    def page_context(self, request, object_id) -> dict:
        return {"can_act": self.has_change_permission(request), "title": "Scheduled message"}

    @admin.action(description="Cancel selected scheduled messages", permissions=["change"])
    def cancel(self, request, queryset):
        cancelled, refused = 0, []
        for channel_pk, message_id in queryset.values_list("channel_id", "message_id")[:10_000]:
            try:
                scheduled_message_cancel(channel_pk=channel_pk, message_id=message_id)
                cancelled += 1
            except DomainError as exc:
                refused.append(f"{message_id}: {exc.detail}")
        text = f"Cancelled {cancelled:,} scheduled message{'s' if cancelled != 1 else ''}."
        logger.info("admin user %s: %s (%d refused)", request.user.get_username(), text, len(refused))
        if refused:
            text += f" Not cancelled ({len(refused)}): " + "; ".join(refused[:10])
            text += "; ..." if len(refused) > 10 else ""
        self.message_user(request, text, messages.SUCCESS if cancelled and not refused else messages.WARNING)

    def get_urls(self):
        return [
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view),
                 name="broker_scheduledmessage_cancel"),
            *super().get_urls(),
        ]

    def cancel_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        obj = get_object_or_404(ScheduledMessage, pk=int(object_id) if str(object_id).isdigit() else -1)
        self.cancel(request, ScheduledMessage.objects.filter(pk=obj.pk))
        if ScheduledMessage.objects.filter(pk=obj.pk).exists():
            return HttpResponseRedirect(reverse("admin:broker_scheduledmessage_change", args=[obj.pk]))
        return HttpResponseRedirect(reverse("admin:broker_scheduledmessage_changelist"))
