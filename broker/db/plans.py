"""Query plans: EXPLAIN a statement as the broker runs it and judge the plan (the index it was
written for is used; no Seq Scan, no unbounded Sort or Hash over the big tables; no JIT).

Used by the plan tests (``tests/plans``, on built worlds) and by ``manage.py broker_plans`` and the
housekeeping watch (``jobs.ops.plans``, on the live database). Two ways to plan a statement:

- ``force_generic_plan``: the plan a server-side prepared statement runs on every broker
  connection (``broker.db.run.PLAN_CACHE_MODE``): ``PREPARE`` + ``EXPLAIN EXECUTE``, the values
  unknown to the planner;
- ``force_custom_plan``: the plan for these values (what Django's client-side binding, and a
  session without the setting, get).

EXPLAIN without ANALYZE runs nothing, so an UPDATE or DELETE is safe to explain. The statement's
registry ``settings:`` are applied first, as ``broker.db.run`` applies them.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field

import psycopg

from broker.db.queries import Query
from broker.queries import Q

BIG_TABLES = ("jobs_job", "broker_message")
SCANS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan", "Tid Scan",
         "Tid Range Scan", "Sample Scan"}
MODES = ("force_generic_plan", "force_custom_plan")
_NAMED = re.compile(r"%\((\w+)\)s")
_POSITIONAL = re.compile(r"(?<!%)%s")
_STATEMENT = "broker_plan_check"  # the prepared statement's name (and a number) while it is explained
_numbers = itertools.count(1)


def to_dollar(sql: str, params) -> tuple[str, list]:
    """``%(name)s`` / ``%s`` placeholders as ``$n`` and the values in that order (what psycopg sends)."""
    if isinstance(params, dict):
        names: list[str] = []

        def number(m):
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        return _NAMED.sub(number, sql).replace("%%", "%"), [params[n] for n in names]
    counter = iter(range(1, 10_000))
    return _POSITIONAL.sub(lambda m: f"${next(counter)}", sql).replace("%%", "%"), list(params or [])


@dataclass
class Node:
    type: str
    relation: str | None
    index: str | None
    children: list["Node"] = field(default_factory=list)
    raw: dict = field(default_factory=dict)
    jit: bool = False  # (the root only) the plan would be JIT-compiled

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    @property
    def cost(self) -> float:
        return float(self.raw.get("Total Cost", 0.0))

    def indexes(self) -> set[str]:
        return {name for n in self.walk() if n.index for name in n.index.split(",")}


def plan_tree(plan: dict) -> Node:
    # an INSERT ... ON CONFLICT names the unique index it probes as its arbiter
    index = plan.get("Index Name") or ",".join(plan.get("Conflict Arbiter Indexes", [])) or None
    node = Node(type=plan["Node Type"], relation=plan.get("Relation Name"), index=index, raw=plan)
    node.children = [plan_tree(p) for p in plan.get("Plans", [])]
    return node


def plan_root(explained) -> Node:
    """The tree of one ``EXPLAIN (FORMAT JSON)`` result, its JIT section noted on the root."""
    top = json.loads(explained)[0] if isinstance(explained, (str, bytes)) else explained[0]
    root = plan_tree(top["Plan"])
    root.jit = bool(top.get("JIT"))
    return root


def _bounded(node: Node, under_limit: bool) -> bool:
    """A scan of a big table below a Sort is bounded when a Limit sits between them, or when it
    is a primary-key lookup (as many rows as ids given, e.g. the inner side of a nested loop)."""
    if node.relation in BIG_TABLES and node.type in SCANS and not under_limit:
        return bool(node.index and node.index.endswith("_pkey"))
    # a SubPlan / InitPlan yields a value per row (an index probe), not rows to sort; the inner
    # side of a nested loop is probed per row of its outer side, which is what bounds it
    children = [c for c in node.children if c.raw.get("Parent Relationship") not in ("SubPlan", "InitPlan")]
    if node.type == "Nested Loop":
        children = children[:1]
    return all(_bounded(c, under_limit or node.type == "Limit") for c in children)


def plan_problems(root: Node, *, index: str | tuple[str, ...], sorts: bool = False,
                  hashes: bool = False) -> list[str]:
    """What is wrong with a plan: the expected index(es) unused ("a|b": either), a Seq Scan of a big
    table, a Sort over an unbounded scan of a big table (unless ``sorts``: a statement that by design
    sorts the rows of one partition), a Hash over one (unless ``hashes``: a statement whose planner
    may, when its statistics call that partition small, hash its rows instead), a JIT-compiled plan.
    Empty when the plan is as written."""
    problems = []
    if root.jit:
        problems.append("JIT-compiled plan (jit must be off on broker sessions)")
    used = root.indexes()
    for name in (index,) if isinstance(index, str) else index:
        if not used & set(name.split("|")):
            problems.append(f"index {name} not used (used: {sorted(used) or 'none'})")
    for n in root.walk():
        if n.type == "Seq Scan" and n.relation in BIG_TABLES:
            problems.append(f"Seq Scan on {n.relation}")
        if not sorts and n.type in ("Sort", "Incremental Sort") and not _bounded(n, False):
            problems.append(f"{n.type} over an unbounded scan of {'/'.join(BIG_TABLES)}")
        if not hashes and n.type == "Hash" and not _bounded(n, False):  # a hash join's table built from the whole table
            problems.append(f"Hash over an unbounded scan of {'/'.join(BIG_TABLES)}")
    return problems


def plan_text(root: Node, depth: int = 0) -> str:
    line = "  " * depth + root.type
    if root.relation:
        line += f" on {root.relation}"
    if root.index:
        line += f" using {root.index}"
    return "\n".join([line, *(plan_text(c, depth + 1) for c in root.children)])


def expected_indexes(q: Query) -> tuple[str, ...]:
    """The registry's ``index:`` line as plan_problems wants it: ``pk`` is the table's primary key
    (any ``*_pkey``), ``a, b`` both, ``a|b`` either."""
    names = []
    for part in q.index.split(","):
        part = part.strip()
        names.append("|".join("jobs_job_pkey" if x.strip() == "pk" else x.strip() for x in part.split("|")))
    return tuple(names)


def explain(conn: psycopg.Connection, statement: Query | str, params, *, mode: str | None) -> Node:
    """The plan of ``statement`` with ``params``: as a prepared statement under ``plan_cache_mode =
    mode`` (``MODES``), or with ``mode=None`` as Django runs a plain statement (the values inlined
    by client-side binding). The settings it changes for this are put back afterwards, so the
    connection plans as before (no transaction is opened or rolled back: psycopg answers a rollback
    with DEALLOCATE ALL, which would drop the broker's own prepared statements)."""
    q = statement if isinstance(statement, Query) else None
    text = statement.sql if isinstance(statement, Query) else statement
    settings = list(q.settings) if q is not None else []
    if mode is not None:
        settings.append(("plan_cache_mode", mode))
    names = [name for name, _ in settings]
    cur = psycopg.ClientCursor(conn)
    saved = [row[0] for row in cur.execute(Q.settings_current.sql, {"names": names})] if names else []
    name = f"{_STATEMENT}_{next(_numbers)}"  # unique: one left behind by a failure never collides
    prepared = False
    try:
        if names:
            cur.execute(Q.settings_session_set.sql, {"names": names, "values": [v for _, v in settings]})
        if mode is None:
            cur.execute("EXPLAIN (FORMAT JSON) " + text, params)
            return plan_root(cur.fetchone()[0])
        dollar, values = to_dollar(text, params)
        cur.execute(f"PREPARE {name} AS {dollar}")  # no parameters: the text is sent as it is
        prepared = True
        call = f"({', '.join(['%s'] * len(values))})" if values else ""
        cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}{call}", values or None)
        return plan_root(cur.fetchone()[0])
    finally:
        status = conn.info.transaction_status
        if not conn.broken and status in (psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS):
            if prepared:
                cur.execute(f"DEALLOCATE {name}")
            if names:
                cur.execute(Q.settings_session_set.sql, {"names": names, "values": saved})
        # (in a failed transaction its rollback puts the settings back, and on a lost connection
        # there is nothing to put back; a statement left behind stays until the session ends,
        # under a name never used again)
