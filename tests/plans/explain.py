"""Plan inspection for the plan tests: EXPLAIN a statement exactly as the broker runs it and
judge the plan (which indexes it uses; no Seq Scan and no unbounded Sort over the big tables).

Two ways a statement runs:
- ``prepared``: a server-side prepared statement (``broker.db.run.query_fetchall(..., prepare=True)``, the push
  dispatcher's bound cursor) planned with ``plan_cache_mode = force_generic_plan``, as every
  broker connection sets it (``broker.apps``). Tested with ``PREPARE`` + ``EXPLAIN EXECUTE``
  under that setting, so the test sees the generic plan that actually runs (and, for robustness
  behind a pooler that drops the setting, also the custom plan).
- ``plain``: Django's cursor binds parameters client-side, so PostgreSQL plans the statement with
  its literal values every time: ``EXPLAIN`` of the statement with the literals inlined.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

BIG_TABLES = ("jobs_job", "broker_message")
SCANS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan", "Tid Scan",
         "Tid Range Scan", "Sample Scan"}
_NAMED = re.compile(r"%\((\w+)\)s")
_POSITIONAL = re.compile(r"(?<!%)%s")


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

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def plan_tree(plan: dict) -> Node:
    # an INSERT ... ON CONFLICT names the unique index it probes as its arbiter
    index = plan.get("Index Name") or ",".join(plan.get("Conflict Arbiter Indexes", [])) or None
    node = Node(type=plan["Node Type"], relation=plan.get("Relation Name"), index=index, raw=plan)
    node.children = [plan_tree(p) for p in plan.get("Plans", [])]
    return node


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


def plan_problems(root: Node, *, index: str | tuple[str, ...], sorts: bool = False) -> list[str]:
    """What is wrong with a plan: the expected index(es) unused ("a|b": either), a Seq Scan of a big
    table, a Sort or a Hash over an unbounded scan of a big table (unless ``sorts``: a statement that by design
    sorts the rows of one partition). Empty when the plan is as written."""
    problems = []
    used = {name for n in root.walk() if n.index for name in n.index.split(",")}
    for name in (index,) if isinstance(index, str) else index:
        if not used & set(name.split("|")):
            problems.append(f"index {name} not used (used: {sorted(used) or 'none'})")
    for n in root.walk():
        if n.type == "Seq Scan" and n.relation in BIG_TABLES:
            problems.append(f"Seq Scan on {n.relation}")
        if not sorts and n.type in ("Sort", "Incremental Sort") and not _bounded(n, False):
            problems.append(f"{n.type} over an unbounded scan of {'/'.join(BIG_TABLES)}")
        if n.type == "Hash" and not _bounded(n, False):  # a hash join's table built from the whole table
            problems.append(f"Hash over an unbounded scan of {'/'.join(BIG_TABLES)}")
    return problems


def plan_text(root: Node, depth: int = 0) -> str:
    line = "  " * depth + root.type
    if root.relation:
        line += f" on {root.relation}"
    if root.index:
        line += f" using {root.index}"
    return "\n".join([line, *(plan_text(c, depth + 1) for c in root.children)])


def explain_prepared(conn, sql: str, params, *, mode: str = "force_generic_plan") -> Node:
    """The plan of ``sql`` as a prepared statement under ``plan_cache_mode = mode`` (``conn`` in
    autocommit; EXPLAIN without ANALYZE runs nothing)."""
    import psycopg

    text, values = to_dollar(sql, params)
    conn.execute(f"SET plan_cache_mode = {mode}")
    conn.execute(f"PREPARE plan_case AS {text}")
    try:
        cur = psycopg.ClientCursor(conn)
        if values:
            cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE plan_case({', '.join(['%s'] * len(values))})", values)
        else:
            cur.execute("EXPLAIN (FORMAT JSON) EXECUTE plan_case")
        return plan_tree(_json(cur.fetchone()[0])[0]["Plan"])
    finally:
        conn.execute("DEALLOCATE plan_case")
        conn.execute("RESET plan_cache_mode")


def explain_plain(conn, sql: str, params) -> Node:
    """The plan of ``sql`` with its parameters inlined as literals (Django's client-side binding)."""
    import psycopg

    cur = psycopg.ClientCursor(conn)
    cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
    return plan_tree(_json(cur.fetchone()[0])[0]["Plan"])


def _json(value):
    return json.loads(value) if isinstance(value, (str, bytes)) else value
