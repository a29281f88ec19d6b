"""The hot statements and the index each was written for: one table, one row per statement.

Each case names the statement (``app:name`` in the app's named-query registry, or
``module.CONSTANT`` for SQL not moved there yet; resolved by ``statement_sql``), how it runs (``prepared``: a server-side
prepared statement, generic plan; ``plain``: Django's cursor, literals), its parameters for the
test world (``tests/plans/conftest.py``) and the index(es) it must use. ORM statements give a
callable that returns (sql, params).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from jobs.state import DEAD, DELIVERED, INFLIGHT, QUEUED


@dataclass(frozen=True)
class Case:
    name: str  # the statement: "module.CONSTANT" (or a label for ORM statements)
    index: str | tuple[str, ...]  # the index(es) it was written for
    params: Callable  # (world) -> dict | list
    run: str = "prepared"  # "prepared" (generic plan) | "plain" (literals)
    sql: Callable | None = None  # (world) -> (sql, params) for statements that are not a constant
    sorts: str = ""  # why a Sort is by design (bounded by one partition's jobs), if it is
    id: str = ""  # test id when one statement is run in two shapes

    @property
    def test_id(self) -> str:
        return self.id or self.name


def statement_sql(case: Case, world) -> tuple[str, object]:
    """The SQL text and parameters of a case: ``app:name`` is a named query of ``<app>.queries``,
    ``module.CONSTANT`` a statement not in a registry yet."""
    if case.sql is not None:
        return case.sql(world)
    if ":" in case.name:
        app, _, name = case.name.partition(":")
        return importlib.import_module(f"{app}.queries").ALL[name].sql, case.params(world)
    module, _, attr = case.name.rpartition(".")
    return getattr(importlib.import_module(module), attr), case.params(world)


# the apps with a named-query registry (``<app>/queries.sql``): every ``-- hot`` query needs a case
REGISTRIES = ("jobs", "consumers", "broker")


def hot_queries() -> list[str]:
    """``app:name`` of every query marked hot in every registry."""
    return [f"{app}:{q.name}" for app in REGISTRIES
            for q in importlib.import_module(f"{app}.queries").ALL.values() if q.hot]


def _claim(w, **extra):
    return {"consumer": w.pull, "limit": 100, "queued": QUEUED, "inflight": INFLIGHT, "timeout": 32.25,
            "inc": None, "reason": "pull", **extra}


def _move_auth(w, to_s=DELIVERED, from_s=(INFLIGHT,), async_commit=False):
    return {"channel": "plans", "consumer": "pull", "job": w.inflight_jobs[0], "ch_token": "t", "c_token": "t",
            "from_s": list(from_s), "to_s": to_s, "inc": None, "dead": DEAD, "inflight": INFLIGHT,
            "timeout": 32.25, "reason": "pull", "async_commit": async_commit}


def _ack(w):
    ids = w.inflight_jobs
    return {"ids": ids, "to_s": [DELIVERED] * len(ids), "delay": [None] * len(ids), "consumer": w.pull,
            "max_retry": 5, "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT, "reason": "pull-ack"}


def _moves(w, ids, from_s, to_s):
    n = len(ids)
    return {"ids": ids, "from_s": [from_s] * n, "to_s": [to_s] * n, "retry_inc": [0] * n, "delay": [None] * n,
            "timeout": [None] * n, "inc": [None] * n, "max_retry": [None] * n, "reset": [False] * n,
            "consumer": w.pull, "reason": "move", "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT}


def _dlq_list(w):
    from django.db.models import OuterRef, Subquery

    from jobs.models import Job, JobStatus, JobTransition

    reason = JobTransition.objects.filter(job_id=OuterRef("pk"), to_status=JobStatus.DEAD).order_by("-id")
    qs = Job.objects.filter(consumer_id=w.pull, status=JobStatus.DEAD).select_related("message").annotate(
        dead_reason=Subquery(reason.values("reason")[:1])).order_by("-pk")[:26]  # web.api.dlq: with Reason
    return qs.query.sql_with_params()


def _admin_jobs(w, **query):
    """The admin's job list query for a GET with these filters (its changelist, first page)."""
    from types import SimpleNamespace

    from django.contrib import admin
    from django.test import RequestFactory

    from jobs.models import Job

    request = RequestFactory().get("/admin/jobs/job/", {k: str(v) for k, v in query.items()})
    request.user = SimpleNamespace(is_active=True, is_staff=True, is_superuser=True, has_perm=lambda *a, **k: True)
    changelist = admin.site._registry[Job].get_changelist_instance(request)
    return changelist.get_queryset(request)[:100].query.sql_with_params()


CASES: list[Case] = [
    # --- claims ---------------------------------------------------------------------------------
    Case("jobs:claim_pull", "job_claim", _claim),
    Case("jobs:claim_pull_bytes", "job_claim", lambda w: _claim(w, max_bytes=10_000)),
    Case("jobs:claim_pull", "job_claim", lambda w: _claim(w, consumer=w.parts), id="claim-partitioned"),
    Case("jobs:claim_push", ("job_push_fresh", "job_push_retry"),
         lambda w: {"limit": 200, "conn_timeout": 30.0, "rational": 2.0, "reason": "push", "worker": "w1"}),
    Case("jobs:queued_jobs", "job_claim", lambda w: {"consumer": w.pull, "queued": QUEUED, "limit": 25}),
    Case("jobs:group_due", "job_claim", lambda w: [w.grouped], run="plain"),
    Case("jobs:group_jobs", "jobs_job_pkey", lambda w: [w.inflight_jobs, INFLIGHT], run="plain"),
    Case("jobs:group_waiters", "pullwaiter_live", lambda w: [w.grouped], run="plain"),
    # --- acks and moves -------------------------------------------------------------------------
    Case("jobs:ack", "jobs_job_pkey", _ack),
    Case("jobs:pull_move_auth", "jobs_job_pkey", _move_auth, id="pull-move-auth-ack"),
    Case("jobs:pull_move_auth", "jobs_job_pkey",
         lambda w: _move_auth(w, to_s=INFLIGHT, from_s=(QUEUED, DEAD)), id="pull-move-auth-claim"),
    Case("jobs:pull_move_auth", "jobs_job_pkey",
         lambda w: _move_auth(w, to_s=INFLIGHT, from_s=(QUEUED, DEAD), async_commit=True), id="pull-move-auth-async"),
    Case("jobs:pull_auth", "jobs_job_pkey",
         lambda w: {"channel": "plans", "consumer": "pull", "job": w.queued_job}),
    Case("jobs:move", "jobs_job_pkey", lambda w: _moves(w, w.inflight_jobs, INFLIGHT, DELIVERED),
         run="plain"),
    Case("jobs:gate_move", "jobs_job_pkey",
         lambda w: {"ids": [w.parts_inflight_job], "gates": [1], "payloads": [None], "keep": [True],
                    "consumer": w.parts}, run="plain"),
    Case("jobs:extend", "jobs_job_pkey",
         lambda w: {"ids": w.inflight_jobs[:1], "inflight": INFLIGHT, "consumer": w.pull, "timeout": 32.25,
                    "inc": None}),
    Case("jobs:push_record", "jobs_job_pkey",
         lambda w: {"ids": w.inflight_jobs, "to_s": [DELIVERED] * 100, "delay": [None] * 100,
                    "max_retry": [5] * 100, "attempts": [1] * 100, "ages": [0.1] * 100, "durations": [5.0] * 100,
                    "codes": [204] * 100, "excerpts": [""] * 100, "errors": [""] * 100,
                    "request_ids": ["r"] * 100, "outcomes": ["delivered"] * 100,
                    "cb_consumers": [w.push], "cb_ok": [False], "cb_fails": [3]}),
    Case("jobs:mark_dead", "jobs_job_pkey",
         lambda w: {"ids": w.inflight_jobs[:5], "queued": QUEUED, "inflight": INFLIGHT, "dead": DEAD,
                    "consumer": None, "reason": "operator"}, run="plain"),
    Case("jobs:pull_job", "jobs_job_pkey", lambda w: [w.queued_job, w.pull], run="plain"),
    # --- sweeps ---------------------------------------------------------------------------------
    # in-flight rows only, either index: O(expired jobs), whatever the backlog
    Case("jobs:expire_all", "job_inflight_deadline|job_inflight_consumer", lambda w: {"max_retry": 5, "limit": 5000},
         run="plain"),
    Case("jobs:expire_consumer", "job_inflight_consumer",
         lambda w: {"max_retry": 5, "limit": 5000, "consumer": w.pull}, run="plain"),
    # expiry: QUEUED rows with an expiry only, by expiry: O(expired jobs), whatever the backlog
    Case("jobs:expire_messages", "job_queued_expiry", lambda w: {"limit": 5000}, run="plain"),
    Case("jobs:expired_status", "jobs_job_pkey", lambda w: {"job": w.dead_job}, run="plain"),
    Case("jobs:partitions_stale", "job_partition_gate", lambda w: [100], run="plain"),
    Case("jobs:partition_counts", "job_partition_gate", lambda w: [w.partition, 0], run="plain",
         sorts="groups the jobs of one partition"),
    Case("jobs:partition_gate_busy", "job_partition_gate",
         lambda w: [w.partition, 0, w.partition, 0], run="plain"),
    Case("jobs:partitions_free", "job_partition_gate", lambda w: {"limit": 1000}, run="plain"),
    # --- operator and DLQ actions ---------------------------------------------------------------
    Case("jobs:requeue_dead", "job_consumer_status",
         lambda w: {"consumer": w.pull, "dead": DEAD, "queued": QUEUED, "ids": None, "limit": 5000,
                    "reason": "requeue"}, run="plain"),
    Case("jobs:delete_dead", "job_consumer_status",
         lambda w: {"consumer": w.pull, "ids": None, "limit": 5000, "reason": "deleted"}, run="plain"),
    Case("jobs:purge_queued", "job_consumer_status",
         lambda w: {"consumer": w.pull, "queued": QUEUED, "purged": 0, "before": None, "age": None,
                    "limit": 5000}, run="plain"),
    # dead jobs only: either index keeps a page's cost independent of the backlog
    Case("dlq list", "job_consumer_status|job_dead", lambda w: None, run="plain", sql=_dlq_list),
    Case("admin job list", "jobs_job_pkey", lambda w: None, run="plain", sql=_admin_jobs),
    Case("admin job list (status, consumer)", "job_consumer_status", lambda w: None, run="plain",
         sql=lambda w: _admin_jobs(w, status__exact=QUEUED, consumer=w.pull)),
    # replay: one chunk of a channel's messages in a window (10,000 a statement), walked by keyset
    Case("jobs:replay_chunk", ("message_channel_received", "job_unique_per_consumer"),
         lambda w: {"channel": w.channel, "consumer": w.push, "after_at": "-infinity", "after_id": 0,
                    "until": "infinity", "only_failed": False, "limit": 10_000}, run="plain"),
    Case("jobs:replay_chunk", ("message_channel_received", "job_unique_per_consumer"),
         lambda w: {"channel": w.channel, "consumer": w.pull, "after_at": "-infinity", "after_id": 0,
                    "until": "infinity", "only_failed": True, "limit": 10_000}, run="plain", id="replay-only-failed"),
    # --- fan-out --------------------------------------------------------------------------------
    Case("jobs:insert_many", "message_unique_per_channel",
         lambda w: {"channel": w.channel, "producer": w.producer, "mids": ["x1", "x2"], "payloads": [b"a", b"b"],
                    "ctypes": ["text/plain"] * 2, "prios": [0, 0], "headers": ["{}", "{}"],
                    "types": ["order.created", None], "ttls": [60, None]}),
    Case("jobs:insert_partitioned", "message_unique_per_channel",
         lambda w: {"channel": w.channel, "producer": w.producer, "mids": ["x1", "x2"], "payloads": [b"a", b"b"],
                    "ctypes": ["text/plain"] * 2, "prios": [0, 0], "headers": ["{}", "{}"],
                    "types": ["order.created", None], "ttls": [60, None],
                    "pkeys": ["k1", "k1"], "gates": [0, 1]}),
    Case("jobs:insert_one", "message_unique_per_channel",
         lambda w: {"channel": w.channel, "producer": w.producer, "mid": "x1", "payload": b"a",
                    "ctype": "text/plain", "prio": 0, "headers": "{}", "type": "order.created", "ttl": 60}),
    Case("jobs:publish_auth", "counter_key", lambda w: {"producer": "plans", "channel": "plans"}),
    # --- doorbell and ready / next-due probes ---------------------------------------------------
    Case("jobs:doorbell_ring", ("job_claim", "job_consumer_status"), lambda w: {"ids": None}, run="plain"),
    Case("jobs:pull_waiter", ("job_push_fresh", "job_push_retry", "job_inflight_consumer"),
         lambda w: {"consumer": w.pull, "group": "", "priority": 0, "pin": "", "batch": 1, "max_bytes": None,
                    "expires": 5.0, "queued": QUEUED, "inflight": INFLIGHT}, run="plain"),
    Case("jobs:pull_next", ("job_push_fresh", "job_push_retry", "job_inflight_consumer"),
         lambda w: {"consumer": w.pull}, run="plain"),
    # --- dashboard and statistics ---------------------------------------------------------------
    Case("jobs:oldest_queued", "job_consumer_status",
         lambda w: {"queued": QUEUED, "ids": w.consumers}, run="plain"),
    Case("jobs:overdue_inflight", "job_inflight_deadline|job_inflight_consumer",
         lambda w: {"inflight": INFLIGHT, "grace": 60, "cap": 1000}, run="plain"),
    # broker_counterdelta holds the deltas since the last compaction (every few seconds): a small
    # table, read by its index or whole
    Case("broker:counter_counts", "counter_key",
         lambda w: {"scope": 1, "ids": [w.pull]}, run="plain"),
    Case("jobs:pull_waiting", "pullwaiter_live", lambda w: [w.pull], run="plain"),
]
