"""The rules that keep the pipeline's reads short: how many chunks a read is cut into, a local
Spark master that retries a failed task (a chunk a replica cancelled), and which database errors
are a replica's conflict with recovery, retried by the small reads."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError

from pipeline import source
from pipeline.readers import chunk_count, chunk_predicates
from pipeline.session import master_with_retries


def test_a_read_is_cut_into_chunks_of_about_the_rows_asked():
    assert chunk_count(low=1, high=1_000_000, chunk_rows=100_000) == 10
    assert chunk_count(low=1, high=1_000_001, chunk_rows=100_000) == 11  # never more rows than asked
    # by message id: a table with 2.5 rows per message needs 2.5 times the chunks
    assert chunk_count(low=1, high=1_000_000, rows_per_key=2.5, chunk_rows=100_000) == 25
    assert chunk_count(low=501, high=600, rows_per_key=0.5, chunk_rows=10) == 5


def test_a_chunk_holds_at_least_one_key_and_an_empty_or_single_key_read_is_one_chunk():
    assert chunk_count(low=1, high=10, chunk_rows=1, rows_per_key=50) == 10  # one key each, not 500
    assert chunk_count(low=None, high=None) == 1
    assert chunk_count(low=7, high=7, chunk_rows=1) == 1
    assert chunk_count(low=1, high=100, chunk_rows=0) == 100  # a size of 0 means one key per chunk


def test_the_chunk_size_comes_from_the_setting(settings):
    settings.BROKER_PIPELINE_CHUNK_ROWS = 25
    assert chunk_count(low=1, high=100) == 4


@pytest.mark.parametrize("master,want", [
    ("local", "local[1,4]"), ("local[2]", "local[2,4]"), ("local[*]", "local[*,4]"),
    ("local[2,3]", "local[2,3]"), ("spark://h:7077", "spark://h:7077"), ("yarn", "yarn"),
])
def test_a_local_master_retries_a_failed_task(master, want):
    assert master_with_retries(master) == want


def _django_error(sqlstate: str) -> OperationalError:
    """A database error as Django raises it: psycopg's, with its SQLSTATE, as the cause."""
    cause = psycopg.errors.lookup(sqlstate)("canceling statement due to conflict with recovery")
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


def test_conflicts_with_recovery_are_retried_and_other_errors_are_not(monkeypatch):
    monkeypatch.setattr(source, "CONFLICT_PAUSE_S", 0)
    assert source.recovery_conflict(_django_error("40001")) and source.recovery_conflict(_django_error("40P01"))
    assert not source.recovery_conflict(_django_error("57014"))  # statement_timeout, a cancel by hand
    calls = []

    @source.replica_retry
    def read(fail: list[str]):
        calls.append(1)
        if fail:
            raise _django_error(fail.pop(0))
        return "rows"

    assert read(["40001", "40P01"]) == "rows" and len(calls) == 3
    calls.clear()
    with pytest.raises(OperationalError):
        read(["57014"])
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(OperationalError):  # a replica that keeps cancelling: given up after the last try
        read(["40001"] * source.CONFLICT_ATTEMPTS)
    assert len(calls) == source.CONFLICT_ATTEMPTS


def test_chunks_are_disjoint_cover_every_key_from_the_lowest_and_the_last_is_open_above():
    predicates = chunk_predicates(column="message_id", low=101, high=200, chunks=3)
    assert predicates == ["message_id >= 101 AND message_id < 134", "message_id >= 134 AND message_id < 167",
                          "message_id >= 167"]
    for low, high, chunks in ((1, 10, 10), (5, 1_000_003, 7), (17, 18, 2), (1, 1, 1)):
        predicates = chunk_predicates(column="id", low=low, high=high, chunks=chunks)
        assert len(predicates) == chunks
        for key in range(low, high + 50):  # every key from the lowest (and past the highest) in one chunk
            if key > low + 2000 and key < high - 2000:
                continue
            assert sum(_matches(p, key) for p in predicates) == 1, (key, predicates)
        assert not any(_matches(p, low - 1) for p in predicates)


def _matches(predicate: str, key: int) -> bool:
    """Evaluate a chunk predicate for ``key`` (only ``>=``, ``<`` and ``AND`` occur)."""
    result = True
    for part in predicate.split(" AND "):
        _column, op, value = part.split()
        result &= key >= int(value) if op == ">=" else key < int(value)
    return result


def test_a_chunk_column_must_be_a_column_name():
    with pytest.raises(ValueError):
        chunk_predicates(column="id; DROP TABLE x", low=1, high=2, chunks=2)
