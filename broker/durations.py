"""Durations as an operator writes them: ``90s``, ``15m``, ``12h``, ``7d``, ``2w``, or plain seconds
(``3600``). One parser for the retention settings (``BROKER_RETENTION``, ``BROKER_DEAD_RETENTION``)
and the channel field ``retention`` (PUT, seed, admin form), so a value accepted anywhere is
accepted everywhere, and one formatter for how the GETs show it. Pure: no Django, no database."""

from __future__ import annotations

import re
from datetime import timedelta

from broker.errors import InvalidInput
from broker.numbers import whole, whole_text

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d{1,12})\s*([smhdw]?)\s*", re.IGNORECASE)
RETENTION_MIN = 1  # second
RETENTION_MAX = 3650 * 86400  # ten years (fits the column, an integer of seconds)


def duration_parse(text: str | int | timedelta) -> int:
    """Whole seconds of ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or a plain number of seconds
    (a ``timedelta`` or an int is taken as it is). ``ValueError`` for anything else."""
    if isinstance(text, timedelta):
        return int(text.total_seconds())
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    text = whole(text)  # 2.0 is an integer (JSON Schema 2020-12)
    if isinstance(text, int):
        return text
    match = _DURATION.fullmatch(whole_text(str(text)))
    if not match:
        raise ValueError(f"not a duration: {str(text)[:40]!r} (use e.g. 90s, 15m, 12h, 7d or seconds)")
    return int(match.group(1)) * UNITS[(match.group(2) or "s").lower()]


def duration_format(seconds: int | timedelta) -> str:
    """The shortest exact form: 604800 -> ``7d``, 5400 -> ``90m``, 90 -> ``90s`` (weeks are
    written in days, as operators do)."""
    seconds = duration_parse(seconds) if isinstance(seconds, timedelta) else int(seconds)
    for unit in ("d", "h", "m"):
        if seconds and seconds % UNITS[unit] == 0:
            return f"{seconds // UNITS[unit]}{unit}"
    return f"{seconds}s"


def retention_parse(raw, *, field: str = "retention") -> int | None:
    """A channel's ``retention``: seconds between RETENTION_MIN and RETENTION_MAX; None when blank,
    ``none`` or ``null`` (the channel then follows BROKER_RETENTION). 400 ``invalid_retention``
    otherwise."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() in ("", "none", "null"):
        return None
    try:
        seconds = duration_parse(text)
    except ValueError:
        raise InvalidInput("invalid_retention", f"{field} must be a duration such as 90s, 15m, 12h, 7d "
                                                f"(or seconds), or empty for the broker's default") from None
    if not RETENTION_MIN <= seconds <= RETENTION_MAX:
        raise InvalidInput("invalid_retention", f"{field} must be between {RETENTION_MIN}s and "
                                                f"{duration_format(RETENTION_MAX)}")
    return seconds
