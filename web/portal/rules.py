"""The portal's pure rules: a link's lifetime and scope as the API takes them, tokens and their
hashes, whether a link or session still holds, and the rate limit's arithmetic. No Django, no
database: tests/web/portal/unit/ checks them."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from broker.durations import duration_format, duration_parse
from broker.errors import InvalidInput

TEST_EVENTS_PER_MINUTE = 5  # per consumer: each holds a web thread up to the probe's 10 s timeout
TTL_DEFAULT = 3600  # seconds: a link opens the portal for an hour unless asked otherwise
TTL_MAX = 30 * 86400
SCOPES = ("manage", "read")


def portal_ttl_parse(raw) -> int:
    """The link's ``ttl``: a duration as the broker's others (``90s``, ``15m``, ``12h``, ``7d``, ``2w``
    or seconds), at least one second and at most TTL_MAX; absent or blank: TTL_DEFAULT. 400
    ``invalid_ttl`` otherwise."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return TTL_DEFAULT
    try:
        seconds = duration_parse(raw)
    except ValueError:
        raise InvalidInput("invalid_ttl", "ttl must be a duration such as 90s, 15m, 12h, 7d (or seconds)") from None
    if not 1 <= seconds <= TTL_MAX:
        raise InvalidInput("invalid_ttl", f"ttl must be between 1s and {duration_format(TTL_MAX)}")
    return seconds


def portal_scope_parse(raw) -> str:
    """``manage`` (absent or blank) or ``read``; 400 ``invalid_scope`` otherwise."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return "manage"
    scope = str(raw).strip().lower()
    if scope not in SCOPES:
        raise InvalidInput("invalid_scope", "scope must be manage or read")
    return scope


def token_new() -> str:
    """A link or session token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored of a token (SHA-256, hex): a random 256-bit token needs no salt or slow hash."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def access_state(*, expires_at: datetime, revoked_at: datetime | None, now: datetime) -> str:
    """``active``, ``expired`` or ``revoked`` (revocation wins: it says more)."""
    if revoked_at is not None:
        return "revoked"
    return "active" if now < expires_at else "expired"


def rate_minute(unix_time: float) -> int:
    """The rate limit's window: whole minutes of unix time."""
    return int(unix_time // 60)


def rate_retry_after(unix_time: float) -> int:
    """Seconds until the next window opens (at least 1)."""
    return max(1, 60 - int(unix_time % 60))


def link_label(link_pk: int) -> str:
    """How advisories name a link (``source`` of a replay it started)."""
    return f"portal link {link_pk}"


def session_idle(*, last_seen_at: datetime, now: datetime, idle: timedelta) -> bool:
    """Whether a session last seen at ``last_seen_at`` has been left idle too long by ``now``."""
    return now - last_seen_at > idle


def seen_every(idle: timedelta) -> timedelta:
    """How often a session's ``last_seen_at`` is written: once a minute, or twice per idle time
    when that is shorter (so the idle end comes at most that late)."""
    return min(timedelta(minutes=1), idle / 2)


def time_ago(seconds: float) -> str:
    """How long ago (or, negative, how far ahead) as people say it: ``just now``, ``12 s ago``,
    ``12 min ago``, ``3 h ago``, ``2 days ago``; ``in 5 min`` for the future."""
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds < 1:
        return "just now"
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            n = int(seconds // size)
            text = f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
            return f"in {text}" if ahead else f"{text} ago"
    return "just now"  # pragma: no cover
