"""Admin for consumers: settings, statistics, dead-job requeue and purge, signing secret rotation.

Saves and deletes go through ``consumers.services`` (the functions behind the consumer API), with
the form's load time as If-Unmodified-Since, so an admin edit never silently overwrites a change
made meanwhile. Tokens and secrets are never shown in full; a rotated secret is shown once, in
the response to the rotation (as the API returns it), never stored in a message or a log.
"""

from __future__ import annotations

import logging

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import http_date
from django.utils.text import Truncator

from broker.counters import JOB, REDELIVERED, counter_column, counts_for
from broker.errors import DomainError, InvalidInput, PreconditionFailed
from broker.message_types import message_types_parse, message_types_text
from broker.registry import Precondition
from consumers import services
from consumers.models import Advisory, Consumer
from jobs.circuit import circuit_state, consumer_circuit_close
from jobs.replay import consumer_replay
from jobs.advisories import advisories_list
from jobs.dashboard import duration_text, minute_series, oldest_queued_ages
from jobs.groups import group_unpin, groups_state, target_for
from jobs.models import Job
from jobs.pull import consumer_stats
from jobs.state import DEAD, DELIVERED, INFLIGHT, QUEUED, jobs_delete_dead, jobs_purge_queued, jobs_requeue_dead
from web import svg
from web.admin.helpers import ServiceFormAdmin, changelist_url, mask, table, url_id_validator

logger = logging.getLogger("web.admin.channels")

# Pending features slot in here: flow control adds a "paused" column, pause/resume actions and
# purge_queued; priority groups add the group pin state, the "Unpin" action and advisories.


def counter_sql(status: int):
    """A consumer's maintained job count for ``status`` as a column (folded count + pending deltas)."""
    return counter_column(owner="consumer", scope=JOB, status=status)


class ConsumerForm(forms.ModelForm):
    new_token = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current token (a new consumer gets a generated one).")
    loaded_at = forms.IntegerField(required=False, widget=forms.HiddenInput)
    max_ack_pending = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1,
        help_text="Flow control: at most this many jobs in flight (empty: 1000).")
    max_queued = forms.IntegerField(
        required=False, min_value=1,
        help_text="Flow control: publishing answers 429 backlog_full at this many QUEUED jobs (empty: unlimited).")
    notify_interval = forms.FloatField(
        required=False, help_text="Doorbell (pull consumers with a callback URL): at most one ring per this many "
                                  "seconds (empty: 1).")
    message_types = forms.CharField(
        required=False, label="Message types", max_length=10000,
        help_text="Filters: comma-separated type patterns (order.created, order.* for order and anything under "
                  "it, * for all). Empty: every message.")
    circuit_breaker_failures = forms.IntegerField(
        required=False, min_value=0, max_value=2**31 - 1,
        help_text="Circuit breaker (push): consecutive failed attempts that open the circuit (empty: 10, 0: off).")
    circuit_breaker_probe_seconds = forms.FloatField(
        required=False, help_text="Circuit breaker: seconds between probe deliveries while open (empty: 30).")

    class Meta:
        model = Consumer
        fields = ("channel", "consumer_id", "name", "type", "callback_url", "max_in_flight",
                  "max_deliveries_per_second", "connection_timeout", "max_retry", "retry_backoff",
                  "max_ack_pending", "max_queued", "notify_interval", "message_types", "circuit_breaker_failures",
                  "circuit_breaker_probe_seconds")
        help_texts = {
            "max_deliveries_per_second": "Empty: no rate limit.",
            "connection_timeout": f"Seconds. Empty: the broker default ({settings.BROKER_CONNECTION_TIMEOUT:g}).",
            "max_retry": f"Empty: the broker default ({settings.BROKER_MAX_RETRY}).",
            "retry_backoff": "Comma-separated seconds, e.g. 5,30,60. Empty: the broker default.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and "loaded_at" in self.fields:
            self.fields["loaded_at"].initial = int(self.instance.updated_at.timestamp())
        if "name" in self.fields:
            self.fields["name"].required = False
        if "consumer_id" in self.fields:
            self.fields["consumer_id"].validators.append(url_id_validator)
        if "message_types" in self.fields:  # shown as the API takes it: comma-separated
            self.initial["message_types"] = message_types_text(self.instance.message_types)

    def clean_message_types(self):
        try:
            return message_types_parse(self.cleaned_data.get("message_types") or "") or None
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean(self):
        data = super().clean()
        ctype = data.get("type") or getattr(self.instance, "type", Consumer.Type.PUSH)
        url = data.get("callback_url", getattr(self.instance, "callback_url", "")) or ""
        try:
            if url:
                services.callback_url_validate(url)
            elif ctype == Consumer.Type.PUSH:
                raise InvalidInput("callback_url_required", "a push consumer needs an absolute callback URL")
        except DomainError as exc:
            self.add_error("callback_url", exc.detail)
        if data.get("max_in_flight") is not None and data["max_in_flight"] < 1:
            self.add_error("max_in_flight", "must be at least 1")
        for name in ("max_deliveries_per_second", "connection_timeout", "notify_interval",
                     "circuit_breaker_probe_seconds"):
            value = data.get(name)
            if value is not None and not 0 < value < 1e9:
                self.add_error(name, "must be positive")
        raw = (data.get("retry_backoff") or "").strip()
        if raw:
            try:
                steps = [float(x) for x in raw.split(",") if x.strip()]
                if not steps or any(s < 0 for s in steps):
                    raise ValueError(raw)
                data["retry_backoff"] = ",".join(f"{s:g}" for s in steps)
            except ValueError:
                self.add_error("retry_backoff", "comma-separated seconds, e.g. 5,30,60")
        return data


class ReplayForm(forms.Form):
    """The admin's replay: a window (UTC) and "only failed", as the API's JSON body."""

    since = forms.DateTimeField(label="Since (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
    until = forms.DateTimeField(label="Until (UTC, empty: now)", required=False,
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
    only_failed = forms.BooleanField(label="Only failed (DEAD) jobs", required=False)


@admin.register(Consumer)
class ConsumerAdmin(ServiceFormAdmin):
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
                    "message_types")
        circuit = ("circuit_breaker_failures", "circuit_breaker_probe_seconds")
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
                                                    "circuit_breaker_probe_seconds")}
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

    # actions

    @admin.action(description="Pause the selected consumers (jobs accumulate, nothing is delivered)",
                  permissions=["change"])
    def pause(self, request, queryset):
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume the selected consumers", permissions=["change"])
    def resume(self, request, queryset):
        self._set_paused(request, queryset, False)

    def _set_paused(self, request, queryset, paused: bool):
        names = []
        for c in queryset:
            services.consumer_pause(consumer=c, paused=paused)
            names.append(f"{c.channel.channel_id}/{c.consumer_id}")
        verb = "Paused" if paused else "Resumed"
        logger.info("admin user %s: %s %s", request.user.get_username(), verb.lower(), ", ".join(names) or "-")
        self.message_user(request, f"{verb} {len(names)} consumer{'s' if len(names) != 1 else ''}.", messages.SUCCESS)

    def _per_consumer(self, request, queryset, run, done: str, kind: str) -> None:
        """Run a bulk job action on each selected consumer, then log and report the counts."""
        counts = [(c, run(c)) for c in queryset]
        total = sum(n for _, n in counts)
        detail = ", ".join(f"{n:,} of {c.channel.channel_id}/{c.consumer_id}" for c, n in counts if n)
        logger.info("admin user %s: %s %d %s jobs (%s)", request.user.get_username(), done, total, kind, detail or "-")
        self.message_user(request, f"{done.capitalize()} {total:,} {kind} job{'s' if total != 1 else ''}"
                          f"{': ' + detail if detail else ''}.", messages.SUCCESS if total else messages.WARNING)

    @admin.action(description="Purge all QUEUED jobs of the selected consumers", permissions=["delete_dead"])
    def purge_queued(self, request, queryset):
        """Flow control: drop a runaway backlog (in batches, history rows with reason "purged")."""
        self._per_consumer(request, queryset, lambda c: jobs_purge_queued(consumer_pk=c.pk), "purged", "queued")

    @admin.action(description="Requeue all dead jobs of the selected consumers", permissions=["change"])
    def requeue_dead(self, request, queryset):
        self._per_consumer(request, queryset, lambda c: jobs_requeue_dead(consumer_pk=c.pk, reason="admin-requeue"),
                           "requeued", "dead")

    @admin.action(description="Delete all dead jobs of the selected consumers", permissions=["delete_dead"])
    def delete_all_dead(self, request, queryset):
        """Asks first (like Django's delete): the dead jobs and their delivery records are gone."""
        consumers = list(queryset)
        if request.POST.get("post") != "yes":
            counts = counts_for(scope=JOB, owner_ids=[c.pk for c in consumers])
            rows = [(c, counts.get(c.pk, {}).get(DEAD, 0)) for c in consumers]
            return TemplateResponse(request, "broker/confirm_action.html", {
                **self.admin_site.each_context(request), "title": "Delete dead jobs?", "opts": self.model._meta,
                "action": "delete_all_dead", "objects": consumers,
                "question": "Delete every dead job of these consumers? Their messages stay; the jobs cannot be "
                            "requeued afterwards.",
                "items": [f"{c.channel.channel_id} / {c.consumer_id}: {n:,} dead job{'s' if n != 1 else ''}"
                          for c, n in rows],
                "confirm_label": "Yes, delete the dead jobs",
            })
        total = sum(jobs_delete_dead(consumer_pk=c.pk) for c in consumers)
        logger.info("admin user %s: deleted %d dead jobs of %s", request.user.get_username(), total,
                    ", ".join(f"{c.channel.channel_id}/{c.consumer_id}" for c in consumers))
        self.message_user(request, f"Deleted {total:,} dead job{'s' if total != 1 else ''}.",
                          messages.SUCCESS if total else messages.WARNING)
        return None

    def has_delete_dead_permission(self, request):
        return request.user.has_perm("jobs.delete_job")

    @admin.action(description="Rotate the signing secret of the selected consumers", permissions=["change"])
    def rotate_secret(self, request, queryset):
        """New secrets are shown once, on the page this returns; the old ones keep signing for the
        grace period (BROKER_SECRET_ROTATION_GRACE), as with POST .../rotate-secret."""
        grace = float(getattr(settings, "BROKER_SECRET_ROTATION_GRACE", 24 * 3600.0))
        rotated = []
        for consumer in queryset.select_related("channel"):
            secret = services.consumer_rotate_secret(consumer=consumer, grace_seconds=grace)
            consumer.refresh_from_db(fields=["previous_secret_expires_at"])
            rotated.append({"consumer": consumer, "secret": secret, "until": consumer.previous_secret_expires_at})
            logger.info("admin user %s: rotated the signing secret of %s/%s", request.user.get_username(),
                        consumer.channel.channel_id, consumer.consumer_id)  # never the secret itself
        response = TemplateResponse(request, "broker/secret_rotated.html", {
            **self.admin_site.each_context(request), "title": "Signing secret rotated", "opts": self.model._meta,
            "rotated": rotated,
        })
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Unpin the priority groups of the selected consumers", permissions=["change"])
    def unpin(self, request, queryset):
        """Same service as POST .../unpin: UNPINNED advisory (reason admin), the next job pins another pull."""
        released = []
        for consumer in queryset.select_related("channel"):
            for group in consumer.priority_groups or []:
                if consumer.priority_policy == "none":
                    continue
                if group_unpin(target=target_for(consumer), group=group, reason="admin")["Unpinned"]:
                    released.append(f"{consumer.channel.channel_id}/{consumer.consumer_id} group {group}")
        logger.info("admin user %s: unpinned %s", request.user.get_username(), ", ".join(released) or "nothing")
        if released:
            self.message_user(request, f"Unpinned {', '.join(released)}.", messages.SUCCESS)
        else:
            self.message_user(request, "No pinned priority group among the selected consumers.", messages.WARNING)

    @admin.action(description="Close the circuit breaker of the selected consumers now", permissions=["change"])
    def circuit_close(self, request, queryset):
        """Same service as POST .../circuit/close: failures forgotten, delivery resumes at once."""
        closed = [f"{c.channel.channel_id}/{c.consumer_id}" for c in queryset.select_related("channel")
                  if consumer_circuit_close(consumer=c)]
        logger.info("admin user %s: closed the circuit of %s", request.user.get_username(), ", ".join(closed) or "-")
        if closed:
            self.message_user(request, f"Closed the circuit of {', '.join(closed)}.", messages.SUCCESS)
        else:
            self.message_user(request, "No open or failing circuit among the selected consumers.", messages.WARNING)

    # one-consumer buttons on its page

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/rotate-secret/", view(self.rotate_secret_view),
                 name="consumers_consumer_rotate_secret"),
            path("<path:object_id>/requeue-dead/", view(self.requeue_dead_view),
                 name="consumers_consumer_requeue_dead"),
            path("<path:object_id>/replay/", view(self.replay_view), name="consumers_consumer_replay"),
            path("<path:object_id>/circuit-close/", view(self.circuit_close_view),
                 name="consumers_consumer_circuit_close"),
            *super().get_urls(),
        ]

    def _one(self, request, object_id):
        if request.method != "POST":
            return None
        if not self.has_change_permission(request):
            raise PermissionDenied
        pk = int(object_id) if str(object_id).isdigit() else -1
        return Consumer.objects.filter(pk=get_object_or_404(Consumer, pk=pk).pk)

    def rotate_secret_view(self, request, object_id):
        queryset = self._one(request, object_id)
        return self.rotate_secret(request, queryset) if queryset is not None else HttpResponseNotAllowed(["POST"])

    def _button(self, request, object_id, action):
        """A one-consumer button: run the action on it (POST only), back to its page."""
        queryset = self._one(request, object_id)
        if queryset is None:
            return HttpResponseNotAllowed(["POST"])
        action(request, queryset)
        return HttpResponseRedirect(reverse("admin:consumers_consumer_change", args=[object_id]))

    def requeue_dead_view(self, request, object_id):
        return self._button(request, object_id, self.requeue_dead)

    def circuit_close_view(self, request, object_id):
        return self._button(request, object_id, self.circuit_close)

    def replay_view(self, request, object_id):
        """The replay form (GET) and the replay itself (POST): ``jobs.replay.consumer_replay``, as the API."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        consumer = get_object_or_404(Consumer.objects.select_related("channel"),
                                     pk=int(object_id) if str(object_id).isdigit() else -1)
        form = ReplayForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                result = consumer_replay(consumer=consumer, since=data["since"], until=data.get("until"),
                                         only_failed=data["only_failed"], source="admin")
            except DomainError as exc:
                form.add_error(None, exc.detail)
            else:
                logger.info("admin user %s: replayed %d messages to %s/%s (%d skipped)", request.user.get_username(),
                            result.replayed, consumer.channel.channel_id, consumer.consumer_id, result.skipped)
                self.message_user(request, f"Replayed {result.replayed:,} message{'s' if result.replayed != 1 else ''}"
                                  f" to {consumer.channel.channel_id}/{consumer.consumer_id} ({result.skipped:,} "
                                  "skipped).", messages.SUCCESS if result.replayed else messages.WARNING)
                return HttpResponseRedirect(reverse("admin:consumers_consumer_change", args=[consumer.pk]))
        return TemplateResponse(request, "broker/replay_form.html", {
            **self.admin_site.each_context(request), "title": f"Replay messages to {consumer}",
            "opts": self.model._meta, "original": consumer, "form": form,
        })

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"can_act": self.has_change_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)


@admin.register(Advisory)
class AdvisoryAdmin(admin.ModelAdmin):
    """Recorded advisories (pins, unpins, ...): read-only, they are a log."""

    list_display = ("created_at", "type", "channel_id", "consumer_id", "group", "detail")
    list_filter = ("type",)
    search_fields = ("channel_id", "consumer_id", "group")
    ordering = ("-id",)
    show_facets = admin.ShowFacets.NEVER

    @admin.display(description="detail")
    def detail(self, obj):
        return ", ".join(f"{k}={v}" for k, v in (obj.data or {}).items())

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
