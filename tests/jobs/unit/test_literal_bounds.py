"""The literal bounds inside the hot statements (a LIMIT the planner can read, issue 21) agree with
the Python limits their callers are held to: a bound below its limit would silently cut a claim."""

from __future__ import annotations

import importlib
import re

import pytest

from jobs.pull.queries import ALL

pytestmark = pytest.mark.unit

BOUND = re.compile(r"LIMIT (\d+)\s+-- bound: ([\w.]+)")


def _bounds():
    return [(q.name, int(n), path) for q in ALL.values() for n, path in BOUND.findall(q.text)]  # (as written)


def test_every_literal_bound_names_a_limit_it_is_not_below():
    found = _bounds()
    assert {name for name, _, _ in found} >= {"claim_pull", "queued_jobs"}
    for name, literal, path in found:
        module, _, attr = path.rpartition(".")
        limit = getattr(importlib.import_module(module), attr)
        assert literal >= limit, f"{name}: LIMIT {literal} is below {path} = {limit}"


def test_the_caller_limit_stays_outside_the_bound():
    """The bound is the inner LIMIT; the caller's limit (a parameter or the consumer's room) is
    applied outside it, so the statement still returns at most what the caller asked for."""
    for name in ("claim_pull", "queued_jobs"):
        sql = ALL[name].text
        inner = BOUND.search(sql).end()
        assert re.search(r"\)\s*\w*\s+(ORDER BY [^()]*?\s+)?LIMIT ", sql[inner:]), name  # (a merge's order may come first)
