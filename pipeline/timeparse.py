"""Durations ("30d", "12h") and moments ("7d" ago, or an ISO date/time) for the command line."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def duration_parse(text: str | int | float | timedelta) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s``; a bare number means days."""
    if isinstance(text, timedelta):
        return text
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m, 2w)")
    value, unit = float(match.group(1)), (match.group(2) or "d").lower()
    return timedelta(**{_UNITS[unit]: value})


def moment_parse(text: str | datetime, *, now: datetime | None = None) -> datetime:
    """A duration means that long before ``now``; otherwise an ISO date or date-time (UTC if naive)."""
    if isinstance(text, datetime):
        moment = text
    else:
        try:
            return (now or datetime.now(timezone.utc)) - duration_parse(text)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"not a moment: {text!r} (use e.g. 7d or 2026-01-31T00:00:00Z)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


def sql_timestamp(moment: datetime) -> str:
    """A timestamptz literal for SQL handed to Spark's JDBC reader (which takes no parameters).
    Only ever built from a datetime, never from user text, so it cannot inject."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return f"TIMESTAMPTZ '{moment.astimezone(timezone.utc).isoformat()}'"
