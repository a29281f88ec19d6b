"""Cursor pagination in webhook-broker's shape: ``{"Result": [...], "Pages": {"next", "previous"}}``.

The cursor is an opaque base64 of the last row's id; rows are ordered newest first (id DESC).
Cursors are parsed strictly (a bad one is a 400), never spliced into SQL.
"""

from __future__ import annotations

import base64
from urllib.parse import urlencode

from broker.errors import InvalidInput

PAGE_SIZE = 25

# The cursors ``_encode`` hands out, as the OpenAPI schema gives them (``next`` / ``previous``):
# unpadded base64url of a row id's decimal digits. Each 3 digits ("0".."9": 0x30-0x39) encode to 4
# characters, a last 1 or 2 digits to 2 or 3; ``_decode`` reads every string of this form. At most
# 18 digits (24 characters): larger than any id a table reaches, and within bigint.
_DIGIT_PAIR_HEAD = "(?:[MN][DTjz]|O[DT])"  # the first two characters of one or more digits
CURSOR_PATTERN = (rf"^(?:{_DIGIT_PAIR_HEAD}[AEIMQUYcgk][w-z0-5])*"
                  rf"(?:(?:[MN][AQgw]|O[AQ])|{_DIGIT_PAIR_HEAD}[AEIMQUYcgk])?$")
CURSOR_MAX_LENGTH = 24


def _encode(pk: int) -> str:
    return base64.urlsafe_b64encode(str(pk).encode()).decode().rstrip("=")


def _decode(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return int(base64.urlsafe_b64decode(padded.encode()).decode())
    except (ValueError, UnicodeError):
        raise InvalidInput("invalid_cursor", "pagination cursor is not valid") from None


def paginate(request, queryset, *, path: str, item, page_size: int = PAGE_SIZE, keep_params=()) -> dict:
    """One page of ``queryset`` (any order is replaced by id DESC) as the list shape."""
    next_c = request.query_params.get("next")
    prev_c = request.query_params.get("previous")
    if next_c and prev_c:
        raise InvalidInput("invalid_cursor", "use either next or previous, not both")
    qs = queryset
    if next_c:
        rows = list(qs.filter(pk__lt=_decode(next_c)).order_by("-pk")[: page_size + 1])
        has_more, has_before = len(rows) > page_size, True
        rows = rows[:page_size]
    elif prev_c:
        rows = list(qs.filter(pk__gt=_decode(prev_c)).order_by("pk")[: page_size + 1])
        has_before, has_more = len(rows) > page_size, True
        rows = list(reversed(rows[:page_size]))
    else:
        rows = list(qs.order_by("-pk")[: page_size + 1])
        has_more, has_before = len(rows) > page_size, False
        rows = rows[:page_size]
    extra = [(k, v) for k in keep_params for v in request.query_params.getlist(k)]
    pages = {}
    if rows and has_more:
        pages["next"] = f"{path}?{urlencode(extra + [('next', _encode(rows[-1].pk))])}"
    if rows and has_before:
        pages["previous"] = f"{path}?{urlencode(extra + [('previous', _encode(rows[0].pk))])}"
    return {"Result": [item(r) for r in rows], "Pages": pages}
