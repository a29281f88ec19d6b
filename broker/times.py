"""The one date-time format of the API and of what the broker sends: RFC 3339 in UTC with ``Z``."""

from __future__ import annotations

from datetime import datetime, timezone

from broker.db.run import query_fetchone
from broker.errors import InvalidInput
from broker.queries import Q


def rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def rfc3339_parse(raw, *, field: str) -> datetime:
    """An RFC 3339 date-time with a zone (``2030-01-02T03:04:05Z``, ``...+02:00``) in UTC; anything
    else is a 400 ``invalid_<field>``."""
    value = raw.strip() if isinstance(raw, str) else ""
    try:
        if len(value) < 19 or value[10] not in "Tt ":
            raise ValueError(value)
        when = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "zZ" else value)
        if when.tzinfo is None:
            raise ValueError(value)
        return when.astimezone(timezone.utc)  # PostgreSQL refuses offsets beyond +-15:59 Python accepts
    except (ValueError, OverflowError):
        raise InvalidInput(f"invalid_{field}", f"{field} must be an RFC 3339 date-time with a time zone") from None


def db_now() -> datetime:
    """The database's clock: every deadline and window is computed by it, never by a process's."""
    return query_fetchone(Q.db_now)[0]
