"""Every hot statement uses the index it was written for, on big tables in the shapes production
meets (tests/plans/conftest.py: one consumer owning ~all of 1M jobs, a few sharing them, many small
ones; fresh statistics, after VACUUM ANALYZE, after a burst of acks), as its generic plan (what the
prepared statements run: every broker connection plans with plan_cache_mode = force_generic_plan)
and as its custom plan (what Django's client-side binding, and a session without that setting, get):
no Seq Scan, no unbounded Sort or Hash over jobs_job or broker_message, no JIT. The connection has
the session options of every broker connection (jit = off)."""

from __future__ import annotations

import pytest

from broker.db.plans import MODES, explain, plan_problems, plan_text
from jobs.ops.plans import CASES, case_check, hot_queries
from tests.plans.cases import ORM_CASES

# Marked for the database so pytest-django sets up the test database; the cases read the big
# tables through their own connection (committed data), outside the per-test transaction.
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("mode", [pytest.param(m, id=m.split("_")[1]) for m in MODES])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hot_statement_plan(case, mode, stats, big_world, pg):
    result = case_check(case, big_world, conn=pg, mode=mode)
    assert result.ok, (f"{case.name} ({stats}, {mode}):\n" + "\n".join(result.problems) + "\n"
                       + plan_text(result.plan))


@pytest.mark.parametrize("case", ORM_CASES, ids=lambda c: c.name)
def test_orm_statement_plan(case, stats, big_world, pg):
    sql, params = case.sql(big_world)
    plan = explain(pg, sql, params, mode=None)
    problems = plan_problems(plan, index=case.index, sorts=bool(case.sorts), hashes=bool(case.hashes))
    assert not problems, f"{case.name} ({stats}, literals):\n" + "\n".join(problems) + "\n" + plan_text(plan)


def test_every_hot_query_of_every_registry_has_a_plan_case():
    """A query marked ``-- hot`` in a ``<app>/queries.sql`` without a case in jobs.ops.plans.CASES fails:
    its plan is never checked otherwise."""
    covered = {case.query for case in CASES}
    hot = hot_queries()
    assert hot, "no hot queries found: the registries did not load"
    assert not [name for name in hot if name not in covered]


def test_the_plan_connection_has_the_broker_session_options(pg):
    """What makes "no JIT" a finding rather than a given: the EXPLAIN connection is opened with
    the parameters of every broker connection, and those turn JIT off."""
    assert pg.execute("SHOW jit").fetchone()[0] == "off"
