"""``jdbc_sql_render``: the one place a value is written into SQL text (Spark's JDBC reader binds
nothing), so it takes only datetimes and ints and fails on a missing or unused value."""

from datetime import datetime, timedelta, timezone

import pytest

from pipeline.queries import Q
from pipeline.readers import ID_BOUNDS, jdbc_sql_render


def test_datetimes_become_utc_timestamptz_literals_and_ints_their_digits():
    sql = "SELECT 1 FROM t WHERE at < %(cutoff)s AND status = %(status)s AND s2 = %(status)s"
    moment = datetime(2026, 1, 31, 2, tzinfo=timezone(timedelta(hours=2)))
    assert jdbc_sql_render(sql, {"cutoff": moment, "status": 1003}) == (
        "SELECT 1 FROM t WHERE at < TIMESTAMPTZ '2026-01-31T00:00:00+00:00' AND status = 1003 AND s2 = 1003")
    assert jdbc_sql_render("SELECT 1 FROM t WHERE at < %(c)s", {"c": datetime(2026, 1, 31)}) == \
        "SELECT 1 FROM t WHERE at < TIMESTAMPTZ '2026-01-31T00:00:00+00:00'"
    assert jdbc_sql_render(Q.channels_read) == Q.channels_read.sql


@pytest.mark.parametrize("value", ["2026-01-31", "1; DROP TABLE jobs_job", 1.5, True, None, b"1"])
def test_anything_but_a_datetime_or_an_int_is_refused(value):
    with pytest.raises(TypeError):
        jdbc_sql_render("SELECT 1 FROM t WHERE x = %(x)s", {"x": value})


def test_a_missing_or_an_unused_value_is_an_error():
    with pytest.raises(KeyError, match="cutoff"):
        jdbc_sql_render("SELECT 1 FROM t WHERE at < %(cutoff)s", {})
    with pytest.raises(KeyError, match="extra"):
        jdbc_sql_render("SELECT 1 FROM t", {"extra": 1})


def test_each_split_table_has_its_own_bounds_statement():
    for table, query in ID_BOUNDS.items():
        assert query.text == f"SELECT min(id), max(id) FROM {table}"
