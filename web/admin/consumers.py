"""Admin for consumers: settings, statistics and the list's counts. The actions (dead-job requeue
and purge, signing secret rotation, ...) are in ``web.admin.consumer_actions``, the forms in
``web.admin.consumer_forms``, the advisories' log in ``web.admin.advisories``.

Saves and deletes go through ``consumers.services`` (the functions behind the consumer API), with
the form's load time as If-Unmodified-Since, so an admin edit never silently overwrites a change
made meanwhile. Tokens and secrets are never shown in full; a rotated secret is shown once, in
the response to the rotation (as the API returns it), never stored in a message or a log.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html
from django.utils.http import http_date
from django.utils.text import Truncator

from broker.counters import JOB, REDELIVERED, counter_column, counts_for
from broker.errors import DomainError, PreconditionFailed
from broker.registry import Precondition
from consumers import services
from consumers.models import Consumer
from jobs.advisories.record import advisories_list
from jobs.models import Job
from jobs.ops.consumer_stats import consumer_stats
from jobs.ops.dashboard import duration_text, minute_series, oldest_queued_ages
from jobs.pull.groups import groups_state, target_for
from jobs.push.circuit import circuit_state
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from web import svg
from web.admin.consumer_actions import ConsumerActionsMixin
from web.admin.consumer_forms import ConsumerForm
from web.admin.helpers import ServiceFormAdmin, changelist_url, mask, table


def counter_sql(status: int):
    """A consumer's maintained job count for ``status`` as a column (folded count + pending deltas)."""
    return counter_column(owner="consumer", scope=JOB, status=status)


@admin.register(Consumer)
class ConsumerAdmin(ConsumerActionsMixin, ServiceFormAdmin):
    form = ConsumerForm
    list_display = ("consumer_col", "name", "type", "callback_col", "max_in_flight", "paused", "queued_col", "inflight_col",
                    "delivered_col", "dead_col", "token_col")
    list_filter = ("type", "channel")
    list_select_related = ("channel",)
    search_fields = ("consumer_id", "name", "channel__channel_id", "callback_url")
    ordering = ("channel__channel_id", "consumer_id")
    actions = ("requeue_dead", "delete_all_dead", "rotate_secret", "unpin", "purge_queued", "pause", "resume",
               "circuit_close")
    readonly_fields = ("token_col", "signing_secret_col", "previous_secret_col", "statistics", "recent_chart",
                       "priority_groups_col", "circuit_col", "created_at", "updated_at")
    show_facets = admin.ShowFacets.NEVER

    def get_fieldsets(self, request, obj=None):
        identity = ("channel", "consumer_id", "name", "type")
        delivery = ("callback_url", "max_in_flight", "max_deliveries_per_second", "connection_timeout",
                    "max_retry", "retry_backoff", "max_ack_pending", "max_queued", "notify_interval",
                    "message_types", "filter")
        circuit = ("circuit_breaker_failures", "circuit_breaker_probe_seconds", "circuit_breaker_open_after_seconds")
        if obj is None:
            return ((None, {"fields": (*identity, "new_token")}), ("Delivery", {"fields": (*delivery, *circuit)}))
        return (
            (None, {"fields": (*identity, "created_at", "updated_at")}),
            ("Statistics", {"fields": ("statistics", "recent_chart")}),
            *((("Priority groups", {"fields": ("priority_groups_col",)}),)
              if obj.priority_policy != "none" else ()),
            ("Delivery", {"fields": delivery}),
            ("Circuit breaker (push)", {"fields": ("circuit_col", *circuit)}),
            ("Credentials", {"fields": ("token_col", "new_token", "signing_secret_col", "previous_secret_col",
                                        "loaded_at")}),
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("channel", "consumer_id", *self.readonly_fields)  # identity is fixed once created

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            n_queued=counter_sql(QUEUED), n_inflight=counter_sql(INFLIGHT),
            n_delivered=counter_sql(DELIVERED), n_dead=counter_sql(DEAD))

    # columns

    @admin.display(description="consumer", ordering="consumer_id")
    def consumer_col(self, obj):
        return f"{obj.channel.channel_id} / {obj.consumer_id}"

    @admin.display(description="callback")
    def callback_col(self, obj):
        return Truncator(obj.callback_url).chars(48) if obj.callback_url else "-"

    def _jobs_link(self, obj, status: int, value):
        return format_html('<a href="{}">{}</a>', changelist_url(Job, consumer=obj.pk, status__exact=status),
                           f"{int(value or 0):,}")

    @admin.display(description="queued", ordering="n_queued")
    def queued_col(self, obj):
        return self._jobs_link(obj, QUEUED, obj.n_queued)

    @admin.display(description="in flight", ordering="n_inflight")
    def inflight_col(self, obj):
        return self._jobs_link(obj, INFLIGHT, obj.n_inflight)

    @admin.display(description="delivered", ordering="n_delivered")
    def delivered_col(self, obj):
        return self._jobs_link(obj, DELIVERED, obj.n_delivered)

    @admin.display(description="dead", ordering="n_dead")
    def dead_col(self, obj):
        link = self._jobs_link(obj, DEAD, obj.n_dead)
        return format_html('<span class="dead-count">{}</span>', link) if obj.n_dead else link

    @admin.display(description="token")
    def token_col(self, obj):
        return mask(obj.token)

    @admin.display(description="signing secret")
    def signing_secret_col(self, obj):
        return mask(obj.signing_secret)

    @admin.display(description="previous signing secret")
    def previous_secret_col(self, obj):
        if not obj.previous_signing_secret:
            return "(none)"
        until = obj.previous_secret_expires_at
        return f"{mask(obj.previous_signing_secret)}, also signed with until {until:%Y-%m-%d %H:%M:%S} UTC" \
            if until else mask(obj.previous_signing_secret)

    @admin.display(description="jobs")
    def statistics(self, obj):
        stats = consumer_stats(consumer_pk=obj.pk)  # what GET /channel/../consumer/.. reports
        redelivered = counts_for(scope=JOB, owner_ids=[obj.pk]).get(obj.pk, {}).get(REDELIVERED, 0)
        oldest = oldest_queued_ages(consumer_pks=[obj.pk]).get(obj.pk)
        cells = [
            self._jobs_link(obj, QUEUED, stats["NumPending"]), self._jobs_link(obj, INFLIGHT, stats["NumAckPending"]),
            self._jobs_link(obj, DELIVERED, stats["NumDelivered"]), self._jobs_link(obj, DEAD, stats["NumDead"]),
            f"{redelivered:,}", f"{stats['NumWaiting']:,}", duration_text(oldest) if oldest is not None else "-",
        ]
        return table(["queued", "in flight", "delivered", "dead", "being redelivered", "pulls waiting now",
                      "oldest queued"], [cells])

    @admin.display(description="priority groups")
    def priority_groups_col(self, obj):
        """Policy, pins (what GET consumer reports) and the latest advisories."""
        rows = [[g["group"], obj.priority_policy, g.get("pinned_client_id", "-"), g.get("pinned_ts", "-")]
                for g in groups_state(target=target_for(obj))]
        pins = table(["group", "policy", "pinned client id", "pinned since"], rows)
        recent = advisories_list(consumer_pk=obj.pk, limit=10)
        events = table(["when", "advisory", "group", "detail"],
                       [[a["timestamp"], a["type"], a["group"], a.get("pinned_id") or a.get("reason") or ""]
                        for a in reversed(recent)]) if recent else "No advisories yet."
        return format_html("{}<p>Latest advisories (timeout {}s):</p>{}", pins,
                           f"{obj.priority_timeout:g}" if obj.priority_timeout else "-", events)

    @admin.display(description="circuit")
    def circuit_col(self, obj):
        """What GET consumer reports as Circuit, and the latest breaker advisories."""
        circuit = circuit_state(consumer=obj)
        return format_html("{} since {}, {} consecutive failure{}", circuit["State"], circuit["Since"],
                           circuit["Failures"], "" if circuit["Failures"] == 1 else "s")

    @admin.display(description="last hour")
    def recent_chart(self, obj):
        series = minute_series(consumer_pks=[obj.pk]).get(obj.pk)
        if series is None:
            return format_html('<span class="quiet">{}</span>', "No attempts or new jobs in the last hour.")
        return svg.minute_chart(delivered=series.delivered, failed=series.failed, width=640, height=160,
                                title="Attempts per minute")

    # writes through the services

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        fields = {name: data.get(name) for name in ("max_in_flight", "max_deliveries_per_second",
                                                    "connection_timeout", "max_retry", "retry_backoff",
                                                    "max_ack_pending", "max_queued", "notify_interval",
                                                    "message_types", "circuit_breaker_failures",
                                                    "circuit_breaker_probe_seconds",
                                                    "circuit_breaker_open_after_seconds", "filter")}
        if fields["circuit_breaker_open_after_seconds"] is None:
            fields["circuit_breaker_open_after_seconds"] = 10.0
        if fields["circuit_breaker_failures"] is None:
            fields["circuit_breaker_failures"] = 10
        if fields["circuit_breaker_probe_seconds"] is None:
            fields["circuit_breaker_probe_seconds"] = 30.0
        if fields["max_ack_pending"] is None:
            fields["max_ack_pending"] = 1000
        if fields["notify_interval"] is None:
            fields["notify_interval"] = 1.0
        fields["retry_backoff"] = fields["retry_backoff"] or ""
        if change:
            loaded = data.get("loaded_at") or int(form.instance.updated_at.timestamp())
            precondition = Precondition(http_date(loaded))
        else:
            precondition = Precondition(None)
        try:
            consumer, _ = services.consumer_upsert(
                channel=obj.channel, consumer_id=obj.consumer_id, name=data.get("name") or None,
                token=data.get("new_token") or None, callback_url=data.get("callback_url", ""),
                type=data.get("type") or None, settings=fields, precondition=precondition)
        except DomainError as exc:
            if isinstance(exc, PreconditionFailed):
                raise self.refused(PreconditionFailed(exc.code, "the consumer was changed by someone else since you "
                                                                      "opened this page; reload it and try again")) from None
            raise self.refused(exc) from None
        obj.pk = consumer.pk
        obj.updated_at = consumer.updated_at

    def save_related(self, request, form, formsets, change):
        """No related objects are edited here."""

    def get_deleted_objects(self, objs, request):
        """What a delete removes, from the counters: collecting millions of jobs would take minutes."""
        objs = list(objs)
        counts = counts_for(scope=JOB, owner_ids=[o.pk for o in objs])
        jobs = sum(n for o in objs for s, n in counts.get(o.pk, {}).items() if s != REDELIVERED)
        summary = [f"Consumer: {o.channel.channel_id} / {o.consumer_id}" for o in objs]
        summary.append(f"{jobs:,} job{'s' if jobs != 1 else ''} of {'these consumers' if len(objs) > 1 else 'it'}")
        return summary, {"consumers": len(objs), "jobs": jobs}, set(), []

    def delete_model(self, request, obj):
        services.consumer_delete(consumer=obj, precondition=Precondition(http_date(int(obj.updated_at.timestamp()))))

    def delete_queryset(self, request, queryset):
        for obj in queryset.select_related("channel"):
            self.delete_model(request, obj)


    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"can_act": self.has_change_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

