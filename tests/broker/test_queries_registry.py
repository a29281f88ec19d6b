"""The named-query registry (broker/db/queries.py) and the jobs app's queries file, without a
database: the format's rules, and every statement written out whole with its index named."""

from __future__ import annotations

import re

import pytest

from broker.db.queries import QueryFileError, Registry, queries_parse
from broker.db.run import PLAN_CACHE_MODE
from broker.queries import ALL as BROKER_QUERIES
from broker.queries import Q as BROKER_Q
from consumers.queries import ALL as CONSUMER_QUERIES
from jobs.queries import ALL, Q

GOOD = """
-- a file comment before the first query is fine
-- first --
-- index: job_claim
-- hot
-- Why it is shaped so.
SELECT 1
  -- a comment inside the SQL stays part of it
  FROM jobs_job;

-- second --
-- index: none (settings only)
SELECT set_config('a', 'b', true)
"""


def test_blocks_parse_with_their_metadata():
    queries = queries_parse(GOOD)
    assert list(queries) == ["first", "second"]
    first = queries["first"]
    assert first.index == "job_claim" and first.hot and first.doc == "Why it is shaped so."
    assert first.sql.startswith("SELECT 1") and "stays part of it" in first.sql and not first.sql.endswith(";")
    assert not queries["second"].hot and queries["second"].index == "none (settings only)"
    registry = Registry(queries)
    assert registry.first is first and "second" in registry and len(registry) == 2
    with pytest.raises(AttributeError):
        registry.third


@pytest.mark.parametrize(("text", "message"), [
    ("-- q --\nSELECT 1", "no '-- index:' line"),
    ("-- q --\n-- index: pk\n", "has no SQL"),
    ("-- q --\n-- index: pk\nSELECT 1;\n-- q --\n-- index: pk\nSELECT 2", "defined twice"),
    ("SELECT 0\n-- q --\n-- index: pk\nSELECT 1", "before the first"),
])
def test_a_broken_file_fails_to_load(text, message):
    with pytest.raises(QueryFileError, match=message):
        queries_parse(text, source="x.sql")


def test_jobs_queries_are_written_out_whole():
    assert len(ALL) > 40 and BROKER_QUERIES and CONSUMER_QUERIES
    for q in [*ALL.values(), *BROKER_QUERIES.values(), *CONSUMER_QUERIES.values()]:
        assert q.index and q.doc, q.name
        # no Python formatting left to fill in: statuses and shared predicates are written out
        assert not re.search(r"\{[A-Z_]+\}", q.sql), q.name
        assert "%(queued)s" not in q.sql or q.name in {"move", "requeue_dead", "purge_queued", "mark_dead"}, q.name
    # the statements other branches edit keep their names
    for name in ("claim_pull", "claim_push", "push_record", "ack", "insert_one", "insert_many", "insert_partitioned"):
        assert name in Q
    assert Q.claim_pull.hot and Q.claim_pull.index == "job_claim"


def test_the_session_setting_is_the_documented_plan_cache_mode():
    assert BROKER_Q.plan_cache_mode_set.sql == f"SET plan_cache_mode = {PLAN_CACHE_MODE}"
