"""Every hot statement uses the index it was written for, on big tables, with the statistics a
new backlog meets ("fresh") and after ANALYZE: no Seq Scan and no unbounded Sort over jobs_job or
broker_message. Prepared statements are checked as their generic plan (what runs: every broker
connection plans them with plan_cache_mode = force_generic_plan) and as a custom plan (what a
session without that setting would run)."""

from __future__ import annotations

import pytest

from tests.plans.cases import CASES, hot_queries, statement_sql
from tests.plans.explain import explain_plain, explain_prepared, plan_problems, plan_text

# Marked for the database so pytest-django sets up the test database; the cases read the big
# tables through their own connection (committed data), outside the per-test transaction.
pytestmark = pytest.mark.django_db

PARAMS = []
for case in CASES:
    if case.run == "prepared":
        PARAMS += [pytest.param(case, "force_generic_plan", id=f"{case.test_id}-generic"),
                   pytest.param(case, "force_custom_plan", id=f"{case.test_id}-custom")]
    else:
        PARAMS.append(pytest.param(case, None, id=case.test_id))


@pytest.mark.parametrize(("case", "mode"), PARAMS)
def test_statement_plan(case, mode, stats, big_world, pg):
    sql, params = statement_sql(case, big_world)
    plan = explain_prepared(pg, sql, params, mode=mode) if mode else explain_plain(pg, sql, params)
    problems = plan_problems(plan, index=case.index, sorts=bool(case.sorts))
    assert not problems, f"{case.name} ({stats} statistics, {mode or 'literals'}):\n" + "\n".join(problems) \
        + "\n" + plan_text(plan)


def test_every_hot_query_of_every_registry_has_a_plan_case():
    """A query marked ``-- hot`` in a ``<app>/queries.sql`` without a case here fails: its plan is
    never checked otherwise."""
    covered = {case.name for case in CASES}
    hot = hot_queries()
    assert hot, "no hot queries found: the registries did not load"
    assert not [name for name in hot if name not in covered]
