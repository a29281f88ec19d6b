"""The duration rules shared by BROKER_RETENTION / BROKER_DEAD_RETENTION and the channel field
``retention`` (broker.durations): what parses, what is refused, and that a value formats back to
one that parses to the same seconds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.durations import RETENTION_MAX, duration_format, duration_parse, retention_parse
from broker.errors import InvalidInput


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800), ("2w", 1209600), ("3600", 3600), (" 7D ", 604800),
    ("1 h", 3600), (timedelta(minutes=2), 120), (45, 45)])
def test_durations_parse(text, seconds):
    assert duration_parse(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "7x", "1.5h", "-1s", "d7", "7dd", "1 2", True, "1e3"])
def test_bad_durations_raise(text):
    with pytest.raises(ValueError):
        duration_parse(text)


@pytest.mark.parametrize(("seconds", "text"), [(604800, "7d"), (5400, "90m"), (90, "90s"), (3600, "1h"), (0, "0s"),
                                               (timedelta(days=30), "30d")])
def test_durations_format_in_the_largest_exact_unit(seconds, text):
    assert duration_format(seconds) == text


@given(st.integers(min_value=0, max_value=RETENTION_MAX))
def test_format_then_parse_is_the_same_duration(seconds):
    assert duration_parse(duration_format(seconds)) == seconds


def test_retention_field_rules():
    assert retention_parse("15m") == 900 and retention_parse(60) == 60
    for empty in (None, "", " ", "none", "NULL"):
        assert retention_parse(empty) is None
    for bad in ("0", "0s", "3651d", "soon"):
        with pytest.raises(InvalidInput) as exc:
            retention_parse(bad)
        assert exc.value.code == "invalid_retention" and exc.value.detail
    assert retention_parse("3650d") == RETENTION_MAX
