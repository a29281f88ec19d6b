"""The one date-time format of the API and of what the broker sends: RFC 3339 in UTC with ``Z``."""

from __future__ import annotations

from datetime import datetime, timezone


def rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
