"""Message types and consumer type filters (issue 17 part 2), and message TTLs (part 3): the pure
rules. Publishing, the consumer PUT, the seed and the admin form all validate through these, so a
value accepted anywhere is accepted everywhere; the fan-out statement matches in SQL
(``insert_messages`` in jobs/publish/queries.sql) with the same semantics as ``message_type_matches``."""

from __future__ import annotations

import re

from broker.errors import InvalidInput
from broker.numbers import whole, whole_text

MESSAGE_TYPE_MAX = 128
_TYPE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
MATCH_ALL = "*"
PREFIX_SUFFIX = ".*"

TTL_MIN = 1
TTL_MAX = 31_536_000  # one year, in seconds


def message_type_parse(raw: str | None, *, field: str = "X-Broker-Message-Type") -> str | None:
    """A message's type: None when absent or blank, else 1-128 characters of ``[A-Za-z0-9._:/-]``
    (400 ``invalid_message_type`` otherwise)."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput("invalid_message_type", f"{field} must be a string")
    value = raw.strip()
    if value == "":
        return None
    if not _TYPE.fullmatch(value):
        raise InvalidInput("invalid_message_type",
                           f"{field} must be at most {MESSAGE_TYPE_MAX} characters of A-Z a-z 0-9 . _ : / -")
    return value


def message_types_parse(raw: str | None) -> list[str] | None:
    """``messageTypes``: comma-separated patterns, each a type, a type followed by ``.*`` (that
    prefix and anything under it) or ``*`` alone (everything). Returns the patterns in the order
    given, without repeats; an empty list means "all types" (stored as NULL). None: not given.
    400 ``invalid_message_types`` for a bad pattern."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput("invalid_message_types", "messageTypes must be a comma-separated string")
    patterns: list[str] = []
    for part in raw.split(","):
        pattern = part.strip()
        if pattern == "":
            continue
        if pattern != MATCH_ALL:
            base = pattern[:-len(PREFIX_SUFFIX)] if pattern.endswith(PREFIX_SUFFIX) else pattern
            if not _TYPE.fullmatch(base) or len(pattern) > MESSAGE_TYPE_MAX + len(PREFIX_SUFFIX):
                raise InvalidInput("invalid_message_types",
                                   f"messageTypes: {pattern[:80]!r} is not a type, a type followed by .*, or *")
        if pattern not in patterns:
            patterns.append(pattern)
    return patterns


def message_types_text(patterns) -> str:
    """The patterns as the consumer GET shows them (and the PUT takes them): comma-separated."""
    return ",".join(patterns or [])


def message_type_matches(message_type: str | None, patterns) -> bool:
    """Reference semantics of the fan-out filter: no patterns match everything; ``*`` matches
    everything, untyped messages too; otherwise an untyped message matches nothing, ``p.*`` matches
    ``p`` and types starting with ``p.``, any other pattern only the equal type."""
    if not patterns or MATCH_ALL in patterns:
        return True
    if message_type is None:
        return False
    for p in patterns:
        if p.endswith(PREFIX_SUFFIX):
            prefix = p[:-len(PREFIX_SUFFIX)]
            if message_type == prefix or message_type.startswith(prefix + "."):
                return True
        elif message_type == p:
            return True
    return False


def ttl_parse(raw, *, field: str = "X-Broker-Message-TTL") -> int | None:
    """Seconds a message stays deliverable: an integer 1..31,536,000 (400 ``invalid_ttl``); None when
    absent or blank. Accepts the header's text or a JSON integer."""
    if raw is None:
        return None
    raw = whole(raw)  # 2.0 is an integer (JSON Schema 2020-12)
    if isinstance(raw, bool):
        raise InvalidInput("invalid_ttl", f"{field} must be an integer number of seconds")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str):
        text = whole_text(raw.strip())
        if text == "":
            return None
        if not (text.isascii() and text.isdigit()):
            raise InvalidInput("invalid_ttl", f"{field} must be an integer number of seconds")
        value = int(text)
    else:
        raise InvalidInput("invalid_ttl", f"{field} must be an integer number of seconds")
    if not TTL_MIN <= value <= TTL_MAX:
        raise InvalidInput("invalid_ttl", f"{field} must be between {TTL_MIN} and {TTL_MAX} seconds")
    return value
