"""The plan rules of broker.db.plans on hand-made plans (no database)."""

from __future__ import annotations

from broker.db.plans import Node, expected_indexes, plan_problems, plan_root
from broker.db.queries import Query


def _n(type_, relation=None, index=None, *children):
    return Node(type=type_, relation=relation, index=index, children=list(children))


def test_rules_accept_an_index_walk_under_a_limit_and_a_sort_of_its_rows():
    plan = _n("Sort", None, None, _n("Nested Loop", None, None,
                                     _n("Limit", None, None, _n("Index Scan", "jobs_job", "job_claim")),
                                     _n("Index Scan", "broker_message", "broker_message_pkey")))
    assert plan_problems(plan, index="job_claim") == []


def test_rules_reject_a_seq_scan_an_unbounded_sort_and_a_missing_index():
    plan = _n("Limit", None, None, _n("Sort", None, None, _n("Seq Scan", "jobs_job")))
    problems = plan_problems(plan, index="job_claim")
    assert "index job_claim not used (used: none)" in problems
    assert "Seq Scan on jobs_job" in problems
    assert any(p.startswith("Sort over an unbounded scan") for p in problems)


def test_rules_ignore_small_tables():
    assert plan_problems(_n("Seq Scan", "consumers_consumer"), index=()) == []


def test_rules_reject_a_hash_join_over_a_whole_index_and_accept_one_over_bounded_rows():
    unbounded = _n("Hash Join", None, None, _n("CTE Scan"),
                   _n("Hash", None, None, _n("Index Scan", "jobs_job", "job_inflight_deadline")))
    assert plan_problems(unbounded, index="job_inflight_deadline") == [
        "Hash over an unbounded scan of jobs_job/broker_message"]
    bounded = _n("Hash Join", None, None, _n("CTE Scan"),
                 _n("Hash", None, None, _n("Limit", None, None, _n("Index Scan", "jobs_job", "job_claim"))))
    assert plan_problems(bounded, index="job_claim") == []


def test_a_statement_declared_to_hash_one_partitions_rows_may_hash_them():
    """The admin's job list for one consumer (CI, PostgreSQL 15): statistics that call that consumer
    small make a hash join of its job_claim rows; bounded by its jobs like the sort the case allows."""
    plan = _n("Limit", None, None, _n("Incremental Sort", None, None, _n(
        "Nested Loop", None, None,
        _n("Hash Join", None, None, _n("Seq Scan", "broker_channel"),
           _n("Hash", None, None, _n("Index Scan", "jobs_job", "job_claim"))),
        _n("Index Scan", "broker_message", "broker_message_pkey"))))
    assert plan_problems(plan, index="job_claim") == [
        "Incremental Sort over an unbounded scan of jobs_job/broker_message",
        "Hash over an unbounded scan of jobs_job/broker_message"]
    assert plan_problems(plan, index="job_claim", sorts=True) == [  # a sort is not a hash
        "Hash over an unbounded scan of jobs_job/broker_message"]
    assert plan_problems(plan, index="job_claim", sorts=True, hashes=True) == []


def test_rules_reject_a_jit_compiled_plan():
    root = plan_root([{"Plan": {"Node Type": "Index Scan", "Relation Name": "jobs_job", "Index Name": "job_claim"},
                       "JIT": {"Functions": 4, "Options": {"Inlining": True}}}])
    assert plan_problems(root, index="job_claim") == ["JIT-compiled plan (jit must be off on broker sessions)"]
    without = plan_root([{"Plan": {"Node Type": "Index Scan", "Relation Name": "jobs_job", "Index Name": "job_claim"}}])
    assert plan_problems(without, index="job_claim") == []


def test_a_sort_under_a_limit_over_a_seq_scan_is_rejected():
    """The generic plan of issue 21: Limit over Gather Merge over a top-N Sort of a parallel Seq Scan."""
    plan = _n("Limit", None, None, _n("Gather Merge", None, None, _n("Sort", None, None,
                                                                       _n("Seq Scan", "jobs_job"))))
    assert set(plan_problems(plan, index="job_claim")) == {
        "index job_claim not used (used: none)", "Seq Scan on jobs_job",
        "Sort over an unbounded scan of jobs_job/broker_message"}


def test_expected_indexes_read_the_registry_line():
    def q(index):
        return Query(name="x", sql="SELECT 1", index=index, hot=True, doc="")

    assert expected_indexes(q("pk")) == ("jobs_job_pkey",)
    assert expected_indexes(q("job_push_fresh, job_push_retry")) == ("job_push_fresh", "job_push_retry")
    assert expected_indexes(q("job_inflight_deadline|job_inflight_consumer")) == (
        "job_inflight_deadline|job_inflight_consumer",)
