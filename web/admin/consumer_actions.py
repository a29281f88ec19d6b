"""The consumer admin's actions and one-consumer buttons: requeue, delete and purge of jobs,
pause and resume, signing secret rotation, unpin, circuit close and replay. Each calls the same
service function as the HTTP API and logs who did what (the audit trail); a rotated secret is
shown once, on the page the rotation returns, never in a message or a log."""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from broker.counters import JOB, counts_for
from broker.errors import DomainError
from consumers import services
from consumers.models import Consumer
from jobs.ops.dead_jobs import jobs_delete_dead, jobs_purge_queued, jobs_requeue_dead
from jobs.publish.replay import consumer_replay
from jobs.pull.groups import group_unpin, target_for
from jobs.push.circuit import consumer_circuit_close
from jobs.state.transitions import DEAD
from web.admin.consumer_forms import ReplayForm

logger = logging.getLogger("web.admin.channels")


class ConsumerActionsMixin:
    """The actions and buttons of ``ConsumerAdmin``; listed before the ModelAdmin in its bases, so
    ``get_urls`` adds the buttons' URLs ahead of the ModelAdmin's own."""

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
        """The replay form (GET) and the replay itself (POST): ``jobs.publish.replay.consumer_replay``, as the API."""
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
