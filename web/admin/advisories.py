"""Admin for the recorded advisories (priority group pins and unpins, circuit breaker events, ...):
read-only, a log searched by channel, consumer and group."""

from __future__ import annotations

from django.contrib import admin

from consumers.models import Advisory


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
