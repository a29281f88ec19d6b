"""The named-query registry (broker/db/queries.py) and the queries files, without a database: the
format's rules, every statement written out whole with its index named, and one name per statement
across all the registries (jobs keeps one per package)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from broker.db.queries import QueryFileError, Registry, queries_parse
from broker.db.run import PLAN_CACHE_MODE
from broker.queries import Q as BROKER_Q
from jobs.ops.plans import REGISTRIES
from jobs.publish.queries import Q as PUBLISH_Q
from jobs.pull.queries import Q as PULL_Q
from jobs.push.queries import Q as PUSH_Q

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
-- a file comment before the first query is fine
-- first --
-- index: job_claim
-- hot
-- Why it is shaped so.
SELECT 1
  -- a comment inside the SQL stays part of its text, not of what is sent
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
    assert first.text.startswith("SELECT 1") and "stays part of its text" in first.text and not first.text.endswith(";")
    assert first.sql == "SELECT 1 FROM jobs_job"  # as sent: no comment, whitespace collapsed
    assert not queries["second"].hot and queries["second"].index == "none (settings only)"
    registry = Registry(queries)
    assert registry.first is first and "second" in registry and len(registry) == 2
    with pytest.raises(AttributeError):
        registry.third


FRAGMENTED = """
-- open --
-- fragment
-- What both walks ask of a job.
j.status = 1001  -- queued
-- a --
-- index: job_claim
SELECT 1 FROM jobs_job j WHERE {{open}} AND j.id > 0;
-- b --
-- index: job_claim
SELECT 2 FROM jobs_job j WHERE j.id < 0 AND {{open}}
"""


def test_a_fragment_is_written_out_in_each_statement_that_names_it():
    queries = queries_parse(FRAGMENTED)
    assert list(queries) == ["a", "b"]  # a fragment is not a statement
    assert queries["a"].sql == "SELECT 1 FROM jobs_job j WHERE j.status = 1001 AND j.id > 0"  # its comment ends there
    assert queries["b"].sql == "SELECT 2 FROM jobs_job j WHERE j.id < 0 AND j.status = 1001"
    assert "-- queued" in queries["a"].text and "{{" not in queries["a"].text


@pytest.mark.parametrize(("text", "message"), [
    ("-- q --\n-- index: pk\nSELECT {{missing}}", "no fragment named 'missing'"),
    ("-- f --\n-- fragment\nj.id > 0\n-- q --\n-- index: pk\nSELECT 1", "fragment 'f' is never used"),
    ("-- f --\n-- fragment\n-- only words\n-- q --\n-- index: pk\nSELECT {{f}}", "fragment 'f' has no SQL"),
    ("-- f --\n-- fragment\nj.id > 0\n-- f --\n-- index: pk\nSELECT {{f}}", "defined twice"),
    ("-- q --\nSELECT 1", "no '-- index:' line"),
    ("-- q --\n-- index: pk\n", "has no SQL"),
    ("-- q --\n-- index: pk\nSELECT 1;\n-- q --\n-- index: pk\nSELECT 2", "defined twice"),
    ("SELECT 0\n-- q --\n-- index: pk\nSELECT 1", "before the first"),
])
def test_a_broken_file_fails_to_load(text, message):
    with pytest.raises(QueryFileError, match=message):
        queries_parse(text, source="x.sql")


def _all_queries():
    return [q for package in REGISTRIES for q in importlib.import_module(f"{package}.queries").ALL.values()]


def test_jobs_queries_are_written_out_whole():
    queries = _all_queries()
    assert len(queries) > 100
    for q in queries:
        assert q.index and q.doc, q.name
        # no Python formatting left to fill in: statuses and shared predicates are written out
        assert not re.search(r"\{[A-Z_]+\}", q.sql), q.name
        assert "%(queued)s" not in q.sql or q.name in {"requeue_dead", "purge_queued", "mark_dead"}, q.name
    # the statements other branches edit keep their names
    assert {"claim_pull", "ack"} <= set(PULL_Q._queries) and {"claim_push", "push_record"} <= set(PUSH_Q._queries)
    assert "insert_messages" in PUBLISH_Q._queries and PUBLISH_Q.insert_messages.hot
    assert PULL_Q.claim_pull.hot and PULL_Q.claim_pull.index == "job_push_fresh, job_push_retry"


def test_every_registry_is_listed_and_every_name_is_used_once():
    """A queries.sql the plan check and the plan tests do not know would have its hot statements
    unchecked; a name used twice across packages would make "where is X" two answers."""
    found = {".".join(p.parent.relative_to(ROOT).parts) for app in ("broker", "eventtypes", "consumers", "jobs", "sources")
             for p in (ROOT / app).rglob("queries.sql")}
    assert found == set(REGISTRIES)
    names = [q.name for q in _all_queries()]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_session_setting_is_the_documented_plan_cache_mode():
    assert BROKER_Q.plan_cache_mode_set.sql == f"SET plan_cache_mode = {PLAN_CACHE_MODE}"
