"""The request fields the pull routes share: job IDs (xid strings), ``limit``, timeouts and
delays in seconds, bounded integers. Pure parsing; anything wrong is a 400 with its own code."""

from __future__ import annotations

import math

from broker import xid
from broker.errors import InvalidInput
from broker.numbers import whole

QUEUED_JOBS_DEFAULT = 25
QUEUED_JOBS_MAX = 100
TIMEOUT_MAX = 10 * 365 * 24 * 3600.0  # an IncrementalTimeout / Delay beyond ten years is a typo


def job_id_parse(raw: str) -> int | None:
    """Job IDs are xid strings (``broker.xid``, decoded without the database); anything else,
    an integer string too, names no job (404, or a per-job not_found in an ack)."""
    return xid.job_pk(raw)


def limit_parse(raw: str | None, *, default: int = QUEUED_JOBS_DEFAULT, maximum: int = QUEUED_JOBS_MAX) -> int:
    """``limit``: default 25, clipped to 100, 0 allowed; non-integer or negative is a 400."""
    if raw is None or raw == "":
        return default
    text = raw[1:] if raw.startswith("+") else raw
    if not text.isascii() or not text.isdigit():
        raise InvalidInput("invalid_limit", "limit must be a non-negative integer")
    text = text.lstrip("0") or "0"
    # more digits than any limit: clipped without int() (which refuses 4,300+ digits: a 500)
    return maximum if len(text) > 9 else min(int(text), maximum)


def timeout_parse(value, name: str = "IncrementalTimeout") -> float | None:
    """Seconds: a non-negative number (None when absent). 0 counts as absent, as in webhook-broker
    where the field is an unsigned integer whose zero value means 'not given'."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"invalid_{name}", f"{name} must be a number of seconds")
    if value < 0 or value > TIMEOUT_MAX:
        raise InvalidInput(f"invalid_{name}", f"{name} must be between 0 and {TIMEOUT_MAX:.0f} seconds")
    return float(value) if value else None


def int_field(fields: dict, name: str, low: int, high: int, detail: str, *, default=None):
    """An integer field of a JSON body within [low, high] (``default`` when absent); else a 400
    ``invalid_<name>`` (a boolean is not an integer)."""
    value = whole(fields.get(name))  # 2.0 is an integer (JSON Schema 2020-12)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"invalid_{name}", detail)
    return value


RECEIPT_NONE = 0  # what a receipt string the broker never issued reads as: no claim has it (the sequence starts at 1)


def receipt_parse(value, where: str = "") -> int | None:
    """A ``Receipt`` of an ack item or a progress request: the opaque string a pull answered with
    the job (None when absent). A string the broker never issued matches no claim (a stale receipt,
    answered as such); anything but a string is a 400."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("invalid_receipt", f"{where}Receipt must be the string the broker sent with the job")
    return int(value) if value.isascii() and value.isdigit() and 0 < len(value) < 19 else RECEIPT_NONE


def receipt_repr(receipt: int | None) -> str | None:
    """A claim's receipt as clients see it: an opaque string."""
    return None if receipt is None else str(receipt)
