"""Do the hot statements still use the indexes they were written for? The check behind
``manage.py broker_plans``, the housekeeping watch and the plan tests.

Every ``-- hot`` query of the registries (jobs, consumers, broker) has a case here: the parameters
it is explained with, taken from a ``Sample`` (the ids of real consumers, jobs and partitions of the
database, or of the plan tests' world), and the index(es) its registry entry names. A generic plan
does not depend on the values, so a sample only has to have the right types; a custom plan (the
plan tests run both) is planned for them.

The watch (``plans_watch``, a housekeeping step run once a minute by the maintenance task, never
inside a push loop): after each ANALYZE of ``jobs_job`` or ``broker_message`` (autovacuum's or
anyone's) one process re-checks every generic plan, stores the results (``jobs_plancheck``:
/metrics ``broker_plan_regressions``) and logs a WARNING naming each statement that left its index;
a plan that flips with the statistics is seen within a minute of the ANALYZE that flipped it, not
by a user first.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection, transaction

from broker.db.plans import MODES, Node, expected_indexes, explain, plan_problems
from broker.db.queries import Query
from broker.db.run import query_execute, query_fetchall, query_fetchone
from jobs.ops.queries import Q
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.sweeps.retention import END, RETENTION_BATCH, START

logger = logging.getLogger(__name__)
# every named-query registry (``<package>/queries.sql``): jobs has one per package
REGISTRIES = ("broker", "eventtypes", "consumers", "jobs.advisories", "jobs.partitions", "jobs.publish", "jobs.sweeps",
              "jobs.ops", "jobs.pull", "jobs.push", "sources")  # by name (imported when read): sources sits above jobs


@dataclass
class Sample:
    """The ids the statements are explained with."""
    channel: int = 0
    producer: int = 0
    pull: int = 0  # the pull consumer with the biggest backlog
    push: int = 0
    grouped: int = 0  # a pull consumer with priority groups
    parts: int = 0  # a consumer with partitions
    bell: int = 0  # a pull consumer with a doorbell
    queued_job: int = 0  # jobs of ``pull``
    inflight_jobs: list = field(default_factory=lambda: [0])
    dead_job: int = 0
    partition: int = 0  # a partition of ``parts``
    parts_inflight_job: int = 0
    channel_name: str = ""  # the text ids of ``pull`` (the spec path's statements)
    consumer_name: str = ""

    @property
    def consumers(self) -> list[int]:
        return [self.pull, self.push, self.grouped, self.parts, self.bell]


@dataclass(frozen=True)
class Case:
    query: str  # "package:name" in the package's registry
    params: Callable[[Sample], dict | list]
    id: str = ""  # when one statement is explained in more than one shape
    index: str | tuple[str, ...] | None = None  # instead of the registry's index: line (why, in a comment)
    sorts: str = ""  # why a Sort is by design (bounded by one partition's jobs), if it is

    @property
    def name(self) -> str:
        return self.id or self.query

    def statement(self) -> Query:
        return registry(self.query)

    def indexes(self) -> tuple[str, ...] | str:
        return self.index if self.index is not None else expected_indexes(self.statement())


def registry(name: str) -> Query:
    """``package:name`` -> the Query of that package's registry."""
    app, _, query = name.partition(":")
    return importlib.import_module(f"{app}.queries").ALL[query]


def _claim(s: Sample, **extra) -> dict:
    return {"consumer": s.pull, "limit": 100, "max_bytes": None, "timeout": 32.25, "inc": None, "reason": "pull",
            **extra}


def _move_auth(s: Sample, to_s=DELIVERED, from_s=(INFLIGHT,), async_commit=False) -> dict:
    return {"channel": s.channel_name, "consumer": s.consumer_name, "job": s.inflight_jobs[0], "ch_token": "",
            "c_token": "", "from_s": list(from_s), "to_s": to_s, "inc": None, "dead": DEAD, "inflight": INFLIGHT,
            "timeout": 32.25, "reason": "pull", "async_commit": async_commit}


def _ack(s: Sample) -> dict:
    ids = s.inflight_jobs
    return {"ids": ids, "to_s": [DELIVERED] * len(ids), "delay": [None] * len(ids), "consumer": s.pull,
            "max_retry": 5, "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT, "reason": "pull-ack",
            "receipts": [None] * (len(ids) - 1) + [7]}  # receipts: the ack of a claim given with one


def _publish(s: Sample, **extra) -> dict:
    return {"channel": s.channel, "producer": s.producer, "mids": ["x1", "x2"], "payloads": [b"a", b"b"],
            "ctypes": ["text/plain"] * 2, "prios": [0, 0], "headers": ["{}", "{}"],
            "types": ["order.created", None], "ttls": [60, None],
            "tps": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ""], "tss": ["", ""],
            "pkeys": [None, None], "gates": [0, 0], **extra}


def _retention(s: Sample, after: tuple, until: tuple) -> dict:
    # an hour's window: most of the plan tests' messages (10 ms apart) are past it
    return {"channel": s.channel, "after_at": after[0], "after_id": after[1], "until_at": until[0],
            "until_id": until[1], "retention": 3600.0, "dead_retention": 86400.0, "limit": RETENTION_BATCH}


CASES: list[Case] = [
    # --- claims ---------------------------------------------------------------------------------
    Case("jobs.pull:claim_pull", _claim),
    Case("jobs.pull:claim_pull", lambda s: _claim(s, max_bytes=10_000), id="claim-max-bytes"),
    Case("jobs.pull:claim_pull", lambda s: _claim(s, consumer=s.parts), id="claim-partitioned"),
    Case("jobs.push:claim_push", lambda s: {"limit": 200, "conn_timeout": 30.0, "rational": 2.0, "reason": "push",
                                       "worker": "w1", "ids": "{%d}" % s.push, "caps": "{10}"}),
    Case("jobs.pull:queued_jobs", lambda s: {"consumer": s.pull, "queued": QUEUED, "limit": 25}),
    Case("jobs.pull:group_due", lambda s: [s.grouped]),
    Case("jobs.pull:group_jobs", lambda s: [s.inflight_jobs, INFLIGHT]),
    Case("jobs.pull:group_waiters", lambda s: [s.grouped]),
    # --- acks and moves -------------------------------------------------------------------------
    Case("jobs.pull:ack", _ack),
    Case("jobs.pull:pull_move_auth", _move_auth, id="pull-move-auth-ack"),
    Case("jobs.pull:pull_move_auth", lambda s: _move_auth(s, to_s=INFLIGHT, from_s=(QUEUED, DEAD)),
         id="pull-move-auth-claim"),
    Case("jobs.pull:pull_move_auth", lambda s: _move_auth(s, to_s=INFLIGHT, from_s=(QUEUED, DEAD), async_commit=True),
         id="pull-move-auth-async"),
    Case("jobs.pull:pull_auth", lambda s: {"channel": s.channel_name, "consumer": s.consumer_name, "job": s.queued_job}),
    Case("jobs.partitions:gate_move", lambda s: {"ids": [s.parts_inflight_job], "gates": [1], "payloads": [None],
                                      "keep": [True], "consumer": s.parts}),
    Case("jobs.pull:extend", lambda s: {"ids": s.inflight_jobs[:1], "inflight": INFLIGHT, "consumer": s.pull,
                                   "timeout": 32.25, "inc": None, "receipt": None}),
    Case("jobs.pull:extend", lambda s: {"ids": s.inflight_jobs[:1], "inflight": INFLIGHT, "consumer": s.pull,
                                   "timeout": 32.25, "inc": None, "receipt": 7}, id="extend-receipt"),
    Case("jobs.push:push_record", lambda s: {
        "ids": s.inflight_jobs, "to_s": [DELIVERED] * len(s.inflight_jobs), "delay": [None] * len(s.inflight_jobs),
        "max_retry": [5] * len(s.inflight_jobs), "attempts": [1] * len(s.inflight_jobs),
        "ages": [0.1] * len(s.inflight_jobs), "durations": [5.0] * len(s.inflight_jobs),
        "codes": [204] * len(s.inflight_jobs), "excerpts": [""] * len(s.inflight_jobs),
        "errors": [""] * len(s.inflight_jobs), "request_ids": ["r"] * len(s.inflight_jobs),
        "outcomes": ["delivered"] * len(s.inflight_jobs), "cb_consumers": [s.push], "cb_ok": [False],
        "cb_fails": [3], "cb_since": [30.5]}),
    Case("jobs.ops:mark_dead", lambda s: {"ids": s.inflight_jobs[:5], "queued": QUEUED, "inflight": INFLIGHT,
                                      "dead": DEAD, "consumer": None, "reason": "operator"}),
    Case("jobs.pull:pull_job", lambda s: [s.queued_job, s.pull]),
    # --- sweeps ---------------------------------------------------------------------------------
    Case("jobs.sweeps:expire_inflight", lambda s: {"max_retry": 5, "limit": 5000, "consumer": None},
         id="expire-inflight-all"),
    Case("jobs.sweeps:expire_inflight", lambda s: {"max_retry": 5, "limit": 5000, "consumer": s.pull},
         id="expire-inflight-consumer"),
    Case("jobs.sweeps:expire_messages", lambda s: {"limit": 5000}),
    Case("jobs.sweeps:retention_channels", lambda s: {"retention": 3600}),
    Case("jobs.sweeps:retention_batch", lambda s: _retention(s, START, END), id="retention-batch-tip"),
    Case("jobs.sweeps:retention_batch", lambda s: _retention(s, (START[0], 1000), (END[0], 500_000)),
         id="retention-batch-sweep"),
    Case("jobs.partitions:partitions_stale", lambda s: [100]),
    Case("jobs.partitions:partition_counts", lambda s: [s.partition, 0], sorts="groups the jobs of one partition"),
    Case("jobs.partitions:partition_gate_busy", lambda s: [s.partition, 0, s.partition, 0]),
    Case("jobs.partitions:partitions_free", lambda s: {"limit": 1000}),
    # --- operator and DLQ actions ---------------------------------------------------------------
    Case("jobs.ops:requeue_dead", lambda s: {"consumer": s.pull, "dead": DEAD, "queued": QUEUED, "ids": None,
                                         "limit": 5000, "reason": "requeue"}),
    Case("jobs.ops:delete_dead", lambda s: {"consumer": s.pull, "ids": None, "limit": 5000, "reason": "deleted"}),
    Case("jobs.ops:purge_queued", lambda s: {"consumer": s.pull, "queued": QUEUED, "purged": 0, "before": None,
                                         "age": None, "limit": 5000}),
    # --- fan-out --------------------------------------------------------------------------------
    Case("jobs.publish:insert_messages", _publish, id="insert_messages (batch)"),
    Case("jobs.publish:insert_messages", lambda s: _publish(s, pkeys=["k1", "k1"], gates=[0, 1]),
         id="insert_messages (partitioned)"),
    Case("jobs.publish:insert_one", lambda s: {"channel": s.channel, "producer": s.producer, "mid": "x1", "payload": b"a",
                                       "ctype": "text/plain", "prio": 0, "headers": "{}", "type": "order.created",
                                       "ttl": 60, "tp": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                                       "ts": ""}),
    Case("jobs.publish:publish_auth", lambda s: {"producer": "plans", "channel": s.channel_name}),
    # --- doorbell and ready / next-due probes ---------------------------------------------------
    Case("jobs.pull:doorbell_ring", lambda s: {"ids": None}),
    Case("jobs.pull:pull_next", lambda s: {"consumer": s.pull}),
    # --- dashboard and statistics ---------------------------------------------------------------
    Case("jobs.ops:oldest_queued", lambda s: {"queued": QUEUED, "ids": s.consumers}),
    Case("jobs.ops:overdue_inflight", lambda s: {"inflight": INFLIGHT, "grace": 60, "cap": 1000}),
    Case("jobs.sweeps:oldest_messages", lambda s: {"ids": [s.channel]}),
    Case("jobs.sweeps:oldest_consumer_messages", lambda s: {"ids": s.consumers}),
    # two small tables (a row per owner and status; the deltas since the last compaction, every few
    # seconds), read by their indexes or whole: no index to insist on, no big table to scan
    Case("broker:counter_counts", lambda s: {"scope": 1, "ids": [s.pull]}, index=()),
    Case("jobs.ops:pull_waiting", lambda s: [s.pull]),
]


def hot_queries() -> list[str]:
    """``package:name`` of every query marked hot in every registry."""
    return [f"{app}:{q.name}" for app in REGISTRIES
            for q in importlib.import_module(f"{app}.queries").ALL.values() if q.hot]


# Below this many rows in jobs_job the planner rightly reads the small tables whole: a plan there
# says nothing about the plan at a backlog, so only an expected index that does not exist counts.
PLAN_MIN_ROWS = 10_000


@dataclass(frozen=True)
class PlanResult:
    case: str
    mode: str
    indexes: tuple[str, ...]  # every index the plan uses
    cost: float  # the planner's estimated total cost
    problems: tuple[str, ...]  # what makes it a regression
    plan: Node | None = None
    notes: tuple[str, ...] = ()  # what would be a problem at a backlog (tables below PLAN_MIN_ROWS)

    @property
    def ok(self) -> bool:
        return not self.problems


def case_check(case: Case, sample: Sample, *, conn, mode: str, judged: bool = True,
               missing: frozenset[str] = frozenset(), small: frozenset[str] = frozenset()) -> PlanResult:
    """One case's plan in ``mode`` (``broker.db.plans.MODES``) on ``conn`` (a psycopg connection).
    ``judged``: the tables are big enough for the plan to matter (else its problems are notes, but
    an expected index in ``missing``, absent from the database, is a problem at any size).
    ``small``: expected indexes of small tables, which a plan may rightly skip for a scan (noted)."""
    plan = explain(conn, case.statement(), case.params(sample), mode=mode)
    problems = plan_problems(plan, index=case.indexes(), sorts=bool(case.sorts))
    absent = [f"index {name} does not exist" for name in sorted(missing) if name in _names(case.indexes())]
    skippable = {f"index {group} not used" for group in _groups(case.indexes()) if set(group.split("|")) <= small}
    kept = [p for p in problems if p.split(" (used:")[0] not in skippable] if judged else absent
    notes = [p for p in problems if p not in kept]
    return PlanResult(case=case.name, mode=mode, indexes=tuple(sorted(plan.indexes())), cost=plan.cost,
                      problems=tuple(kept), plan=plan, notes=tuple(notes))


def _groups(indexes: str | tuple[str, ...]) -> tuple[str, ...]:
    return (indexes,) if isinstance(indexes, str) else indexes


def _names(indexes: str | tuple[str, ...]) -> set[str]:
    return {n for group in _groups(indexes) for n in group.split("|")}


def plans_check(*, sample: Sample | None = None, modes: tuple[str, ...] = MODES[:1]) -> list[PlanResult]:
    """Every case's plan on the live database (Django's connection), in each of ``modes``
    (default: the generic plan, what the prepared statements run)."""
    sample = sample or sample_live()
    expected = set().union(*(_names(c.indexes()) for c in CASES))
    rows, existing, big = query_fetchone(Q.plan_tables, {"names": sorted(expected)})
    judged = rows >= PLAN_MIN_ROWS
    missing = frozenset(expected - set(existing or []))
    small = frozenset(set(existing or []) - set(big or []))
    connection.ensure_connection()
    with connection.wrap_database_errors:  # psycopg's errors as Django's, as for every other statement
        return [case_check(case, sample, conn=connection.connection, mode=mode, judged=judged, missing=missing,
                           small=small) for case in CASES for mode in modes]


def jobs_rows() -> int:
    """The planner's row count of jobs_job (pg_class.reltuples; -1 before the first ANALYZE)."""
    return int(query_fetchone(Q.plan_tables, {"names": []})[0])


def sample_live() -> Sample:
    """The database's own ids: the pull and push consumers with the biggest backlogs, a consumer
    with priority groups, one with partitions, one with a doorbell, and some of the pull consumer's
    jobs (0 where there is none: a generic plan does not depend on the values)."""
    s = Sample()
    rows = query_fetchall(Q.plan_sample_consumers)
    # (id, type, channel pk, channel id, consumer id, grouped, partitioned, doorbell, queued)
    by_backlog = sorted(rows, key=lambda r: -r[8])
    for row in by_backlog:
        if row[1] == "pull" and not s.pull:
            s.pull, s.channel, s.channel_name, s.consumer_name = row[0], row[2], row[3], row[4]
        if row[1] == "push" and not s.push:
            s.push = row[0]
        if row[5] and not s.grouped:
            s.grouped = row[0]
        if row[6] and not s.parts:
            s.parts = row[0]
        if row[7] and not s.bell:
            s.bell = row[0]
    s.grouped, s.parts, s.bell = s.grouped or s.pull, s.parts or s.pull, s.bell or s.pull
    producer = query_fetchone(Q.plan_sample_producer)
    s.producer = producer[0] if producer else 0

    def jobs(consumer: int, status: int, n: int = 1) -> list[int]:
        found = [r[0] for r in query_fetchall(Q.plan_sample_jobs, {"consumer": consumer, "status": status, "n": n})]
        return found or [0]

    s.queued_job = jobs(s.pull, QUEUED)[0]
    s.inflight_jobs = jobs(s.pull, INFLIGHT, 100)
    s.dead_job = jobs(s.pull, DEAD)[0]
    s.parts_inflight_job = jobs(s.parts, INFLIGHT)[0]
    partition = query_fetchone(Q.plan_sample_partition, {"consumer": s.parts})
    s.partition = partition[0] if partition else 0
    return s


def plan_results_store(results: list[PlanResult], *, analyzed_at) -> None:
    """The latest result per case (what /metrics and the admin read)."""
    query_execute(Q.plan_checks_store, {
        "cases": [r.case for r in results], "modes": [r.mode for r in results],
        "indexes": [", ".join(r.indexes) for r in results], "costs": [r.cost for r in results],
        "problems": ["; ".join(r.problems) for r in results], "analyzed": analyzed_at})


def plan_regressions_count() -> int:
    """Statements whose last checked plan left its index (/metrics ``broker_plan_regressions``)."""
    row = query_fetchone(Q.plan_regressions_count)
    return int(row[0]) if row else 0


def plans_watch() -> int:
    """The housekeeping step: when ``jobs_job`` or ``broker_message`` was analyzed since the last
    check, check every generic plan again (one process: a transaction advisory lock), store the
    results and log a WARNING per statement that left its index. Returns the statements checked."""
    analyzed, checked = query_fetchone(Q.plan_watch_due)
    if analyzed is None or (checked is not None and checked >= analyzed):
        return 0
    with transaction.atomic():
        if not query_fetchone(Q.plan_watch_lock)[0]:
            return 0  # another process is checking
        _, checked = query_fetchone(Q.plan_watch_due)
        if checked is not None and checked >= analyzed:
            return 0
        results = plans_check()
        plan_results_store(results, analyzed_at=analyzed)
    for r in results:
        if not r.ok:
            logger.warning("query plan regression: %s (%s) after the ANALYZE of %s: %s; indexes used: %s",
                           r.case, r.mode, analyzed.isoformat(), "; ".join(r.problems), ", ".join(r.indexes) or "none",
                           extra={"statement": r.case})
    return len(results)
