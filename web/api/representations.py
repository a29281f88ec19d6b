"""JSON shapes of the API objects (webhook-broker's PascalCase field names)."""

from __future__ import annotations

import calendar
from datetime import datetime

from django.utils.http import http_date

from broker.durations import duration_format
from broker.times import rfc3339


def changed_at(value: datetime) -> str:
    """ChangedAt at second precision, so it formats to the same instant as Last-Modified."""
    return rfc3339(value.replace(microsecond=0))


def last_modified(value: datetime) -> str:
    """Last-Modified: the second of ``value`` (whole seconds from its UTC fields: a float timestamp
    of a far date rounds .999985 s up to the next second)."""
    return http_date(calendar.timegm(value.utctimetuple()))


def producer_repr(p) -> dict:
    return {"ID": p.producer_id, "Name": p.name, "Token": p.token, "ChangedAt": changed_at(p.updated_at),
            "RateLimitPerSecond": p.rate_limit_per_second, "Burst": p.burst}


def channel_repr(c) -> dict:
    base = f"/channel/{c.channel_id}"
    return {
        "ID": c.channel_id,
        "Name": c.name,
        "Token": c.token,
        "ChangedAt": changed_at(c.updated_at),
        "ConsumersURL": f"{base}/consumers",
        "MessagesURL": f"{base}/messages",
        "BroadcastURL": f"{base}/broadcast",
        "MessagesStatusURL": f"{base}/messages-status",
        "MessageTTL": c.message_ttl,  # expiry: default TTL (seconds) of its messages; null: none
        # how long a finished message stays stored ("7d"); null: BROKER_RETENTION (Footprint.Retention)
        "Retention": None if c.retention is None else duration_format(c.retention),
        # event types (issue 37): open (a type without an event type passes) or closed (422)
        "EventTypes": c.event_types,
        "EventTypesURL": f"{base}/event-types",
        "AsyncAPIURL": f"{base}/asyncapi.json",
    }


def message_url(channel_id: str, message_id: str) -> str:
    return f"/channel/{channel_id}/message/{message_id}"
