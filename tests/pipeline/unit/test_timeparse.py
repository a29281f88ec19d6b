"""Durations and moments of the pipeline's command line, without a database or Spark."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.timeparse import duration_parse, moment_parse, sql_timestamp

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, delta", [
    ("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), (" 90 M ", timedelta(minutes=90)),
    ("2w", timedelta(weeks=2)), ("45s", timedelta(seconds=45)), ("7", timedelta(days=7)), (3, timedelta(days=3)),
    ("1.5h", timedelta(minutes=90)), (timedelta(hours=1), timedelta(hours=1)),
])
def test_durations(text, delta):
    assert duration_parse(text) == delta


@pytest.mark.parametrize("text", ["", "d", "-1d", "3y", "1e3s", "forever", "1 d 2h"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="not a duration"):
        duration_parse(text)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from("smhdw"))
def test_a_duration_is_its_number_of_units(n, unit):
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    assert duration_parse(f"{n}{unit}").total_seconds() == n * seconds


def test_moments():
    assert moment_parse("7d", now=NOW) == NOW - timedelta(days=7)
    assert moment_parse("2026-01-31T00:00:00Z") == datetime(2026, 1, 31, tzinfo=timezone.utc)
    assert moment_parse("2026-01-31") == datetime(2026, 1, 31, tzinfo=timezone.utc), "naive means UTC"
    assert moment_parse(datetime(2026, 1, 31)) == datetime(2026, 1, 31, tzinfo=timezone.utc)
    plus2 = timezone(timedelta(hours=2))
    assert moment_parse("2026-01-31T02:00:00+02:00") == datetime(2026, 1, 31, 2, tzinfo=plus2)
    with pytest.raises(ValueError, match="not a moment"):
        moment_parse("last tuesday")


def test_sql_timestamps_are_utc_literals():
    assert sql_timestamp(datetime(2026, 1, 31, 2, tzinfo=timezone(timedelta(hours=2)))) == \
        "TIMESTAMPTZ '2026-01-31T00:00:00+00:00'"
    assert sql_timestamp(datetime(2026, 1, 31)) == "TIMESTAMPTZ '2026-01-31T00:00:00+00:00'"
