"""The pure rules of message types, consumer type patterns and TTLs (no database)."""

from __future__ import annotations

import pytest

from broker.errors import InvalidInput
from broker.message_types import (message_type_matches, message_type_parse, message_types_parse, message_types_text,
                                  ttl_parse)


@pytest.mark.parametrize("raw", ["order.created", "a", "A-Z_0:9/x.y", "x" * 128, " padded "])
def test_valid_types(raw):
    assert message_type_parse(raw) == raw.strip()


@pytest.mark.parametrize("raw", ["x" * 129, "has space", "ünïcode", "a*", "a,b", "semi;colon", 5])
def test_invalid_types_are_400(raw):
    with pytest.raises(InvalidInput) as exc:
        message_type_parse(raw)
    assert exc.value.code == "invalid_message_type"


def test_absent_or_blank_type_is_none():
    assert message_type_parse(None) is None and message_type_parse("  ") is None


def test_patterns_parse_trim_dedupe_and_render_back():
    assert message_types_parse(" order.* , invoice.paid,order.*,, *") == ["order.*", "invoice.paid", "*"]
    assert message_types_text(["order.*", "invoice.paid"]) == "order.*,invoice.paid"
    assert message_types_parse("") == [] and message_types_parse(None) is None
    assert message_types_parse("x" * 128 + ".*") == ["x" * 128 + ".*"]


@pytest.mark.parametrize("raw", ["order.**", "order*", "*.created", "or der", "a.*.b", "x" * 129, ".*", "**"])
def test_invalid_patterns_are_400(raw):
    with pytest.raises(InvalidInput) as exc:
        message_types_parse(raw)
    assert exc.value.code == "invalid_message_types"


@pytest.mark.parametrize(("message_type", "patterns", "expected"), [
    ("anything", None, True),
    (None, [], True),
    (None, ["*"], True),
    (None, ["order.*"], False),
    ("order", ["order.*"], True),
    ("order.created", ["order.*"], True),
    ("order.created.v2", ["order.*"], True),
    ("orderly", ["order.*"], False),
    ("order_created", ["order.*"], False),
    ("invoice.paid", ["order.*", "invoice.paid"], True),
    ("invoice.paid.late", ["invoice.paid"], False),
    ("a_b", ["a_b"], True),
    ("aXb", ["a_b"], False),  # no LIKE semantics: _ is a character, not a wildcard
    ("x", ["order.*", "*"], True),
])
def test_match_semantics(message_type, patterns, expected):
    assert message_type_matches(message_type, patterns) is expected


@pytest.mark.parametrize(("raw", "expected"), [("1", 1), (" 60 ", 60), ("31536000", 31_536_000), (5, 5),
                                               (None, None), ("", None)])
def test_ttl_valid(raw, expected):
    assert ttl_parse(raw) == expected


@pytest.mark.parametrize("raw", ["0", 0, "-1", "31536001", 31_536_001, "1.5", 1.5, "x", True, "1e3"])
def test_ttl_invalid_is_400(raw):
    with pytest.raises(InvalidInput) as exc:
        ttl_parse(raw)
    assert exc.value.code == "invalid_ttl"
