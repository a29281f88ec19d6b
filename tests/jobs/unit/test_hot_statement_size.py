"""DB-free: every hot statement fits psycopg's cache of converted queries. psycopg turns a query's
``%(name)s`` placeholders into ``$n`` on every execute and keeps the result only for statements of at
most ``MAX_CACHED_STATEMENT_LENGTH`` bytes (4096): one byte more and the push claim paid a regular
expression over its whole text on every claim (~5 % of a dispatcher's CPU, seen in a profile)."""

from __future__ import annotations

import importlib

import pytest
from psycopg import _queries

from jobs.ops.plans import REGISTRIES

pytestmark = pytest.mark.unit


def test_every_hot_statement_is_short_enough_for_psycopgs_query_cache():
    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    sizes = {f"{app}:{q.name}": len(q.sql.encode()) for app in REGISTRIES
             for q in importlib.import_module(f"{app}.queries").ALL.values() if q.hot}
    assert "jobs.push:claim_push" in sizes
    assert {name: size for name, size in sizes.items() if size > limit} == {}, f"over {limit} bytes"
