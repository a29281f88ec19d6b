"""``portal_time``: a time as people read it on the portal's pages: whole seconds in UTC with a
relative hint (``2026-11-28 19:08:47 UTC (12 min ago)``), the full value (RFC 3339, microseconds)
on hover and in the ``<time>`` element's ``datetime``."""

from __future__ import annotations

from datetime import datetime, timezone

from django import template
from django.utils import timezone as django_timezone
from django.utils.html import format_html

from broker.times import rfc3339
from web.portal.rules import time_ago

register = template.Library()


@register.filter
def portal_time(value):
    """A datetime (or an RFC 3339 string, as advisories keep them) as a ``<time>`` element; "—"
    when there is none."""
    if isinstance(value, str) and value:
        try:
            value = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "zZ" else value)
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    full = rfc3339(value)
    ago = time_ago((django_timezone.now() - value).total_seconds())
    return format_html('<time datetime="{}" title="{}">{} UTC <span class="ago">({})</span></time>', full, full,
                       value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"), ago)
