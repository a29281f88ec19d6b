"""The portal in the operator's admin: every link (who made it, when, its scope, until when, whether
it was revoked and by whom), the sessions opened with it and the changes made through it (its
advisories), with "revoke" actions. Links are made through the API (``POST .../portal-links``),
whose answer is the only place their token appears; nothing here can show it again."""

from __future__ import annotations

import logging

from django.contrib import admin, messages
from django.db.models import Count
from django.utils import timezone

from web.admin.helpers import ReadOnlyAdmin, table
from web.portal.links import portal_changes, portal_links_revoke, portal_sessions_revoke
from web.portal.models import PortalLink, PortalSession
from web.portal.rules import access_state

logger = logging.getLogger("web.admin.channels")  # the admin's audit trail: who did what


class ReadOnlyRows(ReadOnlyAdmin):
    """Rows made by the portal's services, never edited here; revoked by the actions."""

    def has_revoke_permission(self, request):
        return request.user.has_perm("portal.change_portallink")

    def _state(self, *, expires_at, revoked_at) -> str:
        return access_state(expires_at=expires_at, revoked_at=revoked_at, now=timezone.now())


@admin.register(PortalLink)
class PortalLinkAdmin(ReadOnlyRows):
    list_display = ("id", "consumer_col", "scope", "created_by", "created_at", "expires_at", "state_col",
                    "sessions_col")
    list_filter = ("scope",)
    list_select_related = ("consumer__channel",)
    search_fields = ("consumer__consumer_id", "consumer__channel__channel_id", "created_by")
    actions = ("revoke",)
    fields = ("consumer_col", "scope", "created_by", "created_at", "expires_at", "state_col", "revoked_by",
              "sessions_table", "changes_table")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_sessions=Count("sessions"))

    @admin.display(description="consumer", ordering="consumer__consumer_id")
    def consumer_col(self, obj):
        return f"{obj.consumer.channel.channel_id} / {obj.consumer.consumer_id}"

    @admin.display(description="state")
    def state_col(self, obj):
        state = self._state(expires_at=obj.expires_at, revoked_at=obj.revoked_at)
        return f"revoked {obj.revoked_at:%Y-%m-%d %H:%M:%S}" if state == "revoked" else state

    @admin.display(description="sessions", ordering="n_sessions")
    def sessions_col(self, obj):
        return obj.n_sessions

    @admin.display(description="sessions opened with it")
    def sessions_table(self, obj):
        rows = obj.sessions.order_by("-id")[:100]
        return table(["opened", "last seen", "state"],
                     [[s.created_at.strftime("%Y-%m-%d %H:%M:%S"), s.last_seen_at.strftime("%Y-%m-%d %H:%M:%S"),
                       self._state(expires_at=obj.expires_at, revoked_at=s.revoked_at or obj.revoked_at)]
                      for s in rows], empty="Never opened.")

    @admin.display(description="changes made with it")
    def changes_table(self, obj):
        """The advisories naming this link: each change made in the portal, and the replays it started."""
        return table(["when", "advisory", "detail"],
                     [[a.created_at.strftime("%Y-%m-%d %H:%M:%S"), a.type,
                       ", ".join(f"{k}={v}" for k, v in a.data.items() if k not in ("link", "link_created_by"))]
                      for a in portal_changes(consumer_pk=obj.consumer_id, link=obj, limit=100)],
                     empty="None.")

    @admin.action(description="Revoke the selected links (their sessions end at once)", permissions=["revoke"])
    def revoke(self, request, queryset):
        by = f"staff user {request.user.get_username()}"
        n = portal_links_revoke(by=by, link_ids=queryset.values_list("pk", flat=True))
        logger.info("admin user %s: revoked %d portal links", request.user.get_username(), n)
        self.message_user(request, f"Revoked {n} link{'' if n == 1 else 's'}.", messages.SUCCESS if n else messages.WARNING)


@admin.register(PortalSession)
class PortalSessionAdmin(ReadOnlyRows):
    list_display = ("id", "link", "consumer_col", "created_at", "last_seen_at", "state_col")
    list_select_related = ("link__consumer__channel",)
    actions = ("revoke",)

    @admin.display(description="consumer")
    def consumer_col(self, obj):
        return f"{obj.link.consumer.channel.channel_id} / {obj.link.consumer.consumer_id}"

    @admin.display(description="state")
    def state_col(self, obj):
        return self._state(expires_at=obj.link.expires_at, revoked_at=obj.revoked_at or obj.link.revoked_at)

    @admin.action(description="End the selected sessions", permissions=["revoke"])
    def revoke(self, request, queryset):
        n = portal_sessions_revoke(session_ids=queryset.values_list("pk", flat=True))
        logger.info("admin user %s: ended %d portal sessions", request.user.get_username(), n)
        self.message_user(request, f"Ended {n} session{'' if n == 1 else 's'}.", messages.SUCCESS if n else messages.WARNING)
