"""The OpenAPI schema's patterns against the parsers they describe, without a database (issue 29
part 5): every string a pattern allows is read by its parser, and what the broker hands out (cursors,
Last-Modified) matches the pattern a client checks it against."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from django.utils.http import parse_http_date_safe
from hypothesis import given, settings
from hypothesis import strategies as st

from web.api import pagination
from web.api.common import HTTP_DATE
from web.api.representations import last_modified
from web.api.request_bodies import body_needed

CURSOR = re.compile(pagination.CURSOR_PATTERN)
DATE = re.compile(HTTP_DATE["pattern"])


@given(st.integers(min_value=1, max_value=10**18 - 1))
def test_every_cursor_handed_out_matches_the_pattern(pk):
    cursor = pagination._encode(pk)
    assert CURSOR.fullmatch(cursor) and len(cursor) <= pagination.CURSOR_MAX_LENGTH
    assert pagination._decode(cursor) == pk


@settings(max_examples=300)
@given(st.from_regex(pagination.CURSOR_PATTERN, fullmatch=True).filter(lambda c: 0 < len(c) <= 24))
def test_every_cursor_the_pattern_allows_is_read(cursor):
    assert pagination._decode(cursor) >= 0  # no 400 invalid_cursor


@settings(max_examples=300)
@given(st.from_regex(HTTP_DATE["pattern"], fullmatch=True))
def test_every_http_date_the_pattern_allows_is_read(value):
    assert parse_http_date_safe(value) is not None  # no 400 invalid_precondition


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31)))
def test_every_last_modified_matches_the_pattern(when):
    assert DATE.fullmatch(last_modified(when.replace(tzinfo=timezone.utc)))


def test_leap_days_only_in_leap_years():
    assert DATE.fullmatch("Thu, 29 Feb 2024 00:00:00 GMT") and DATE.fullmatch("Tue, 29 Feb 2000 00:00:00 GMT")
    assert not DATE.fullmatch("Sat, 29 Feb 2025 00:00:00 GMT") and not DATE.fullmatch("Thu, 29 Feb 1900 00:00:00 GMT")
    assert not DATE.fullmatch("Fri, 31 Apr 2026 00:00:00 GMT") and not DATE.fullmatch("Sat, 30 Feb 2026 00:00:00 GMT")


def test_a_body_is_required_when_no_empty_one_satisfies_its_schema():
    assert body_needed({"type": "object", "required": ["since"]})
    assert body_needed({"type": "array", "minItems": 1}) and body_needed({"type": "string", "minLength": 1})
    assert body_needed({"anyOf": [{"required": ["a"]}, {"type": "array", "minItems": 1}]})
    assert not body_needed({"anyOf": [{"required": ["a"]}, {"type": "object"}]})
    assert not body_needed({"type": "object", "properties": {"graceSeconds": {"type": "number"}}})
    assert not body_needed({"$ref": "#/components/schemas/Something"})
