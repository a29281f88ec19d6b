"""DB-free: the statements sent to the server are the files' statements without comments and with
collapsed whitespace (``broker.db.queries.sql_compact``), nothing else changed; every hot statement
fits psycopg's cache of converted statements."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from psycopg import _queries

from broker.db.queries import queries_load, sql_compact
from broker.db.run import STATEMENT_CACHE_BYTES

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
FILES = sorted(ROOT.glob("*/queries.sql")) + sorted(ROOT.glob("jobs/*/queries.sql"))


def test_comments_go_strings_and_identifiers_stay():
    sql = """SELECT 'a -- not a comment', "x  y", E'it\\'s -- kept', $b$ -- body $b$  -- gone
      FROM t /* gone */ WHERE a = ( 1 , 2 ) -- gone too"""
    assert sql_compact(sql) == ("""SELECT 'a -- not a comment',"x  y",E'it\\'s -- kept',$b$ -- body $b$ FROM t """
                                """WHERE a = (1,2)""")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_statement_keeps_its_content(path):
    for name, q in queries_load(path).items():
        # the same non-blank characters once comments are dropped (no statement has "--" in a literal)
        assert re.sub(r"\s+", "", re.sub(r"--[^\n]*", "", q.text)) == re.sub(r"\s+", "", q.sql), name
        assert "--" not in q.sql and "\n" not in q.sql, name


def test_hot_statements_fit_psycopgs_statement_cache():
    """psycopg converts a statement's placeholders once and caches the result only below this size:
    above it, every execution parses the text again (the push claim did, at 5.4 KiB)."""
    sizes = {q.name: len(q.sql.encode()) for path in FILES for q in queries_load(path).values() if q.hot}
    assert _queries.MAX_CACHED_STATEMENT_LENGTH >= STATEMENT_CACHE_BYTES  # raised by broker.db.run, read at each call
    assert sizes and max(sizes.values()) < STATEMENT_CACHE_BYTES, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
