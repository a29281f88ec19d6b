"""What a pending migration will do to a live database: its statements (as
``broker.schema_editor`` will run them), the lock each takes, on which table and for how long,
and whether the whole migration is online-safe (``manage.py broker_upgrade_check``; the CI check of
new migrations, tests/system/upgrade/test_migrations.py, reads the same warnings).

The statements come from the schema editor in collect mode (what ``sqlmigrate`` prints), so they
are the online forms django-pg-zero-downtime-migrations writes; each is classified by its leading
words (PostgreSQL's documented lock for that command) and weighed with the table's current size.
A statement that holds a lock blocking reads or writes (SHARE and stronger) for a scan or rewrite
of a table that has rows is not online-safe; nor is an operation the library warns about
(``UnsafeOperationWarning``), nor a statement the table does not list (unsafe until listed); a
``RunPython`` step is flagged for review (its locks are its own).

Which migrations CI checks: those of every installed app of this project (``project_apps``: each
app whose package is a folder of this repository and has migrations, a new one included from its
first migration), numbered after ``CHECKED_AFTER``.
"""

from __future__ import annotations

import re
from pathlib import Path
import warnings
from dataclasses import dataclass, field

from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.operations.special import RunPython
from django_zero_downtime_migrations.backends.postgres.schema import UnsafeOperationWarning

from broker.queries import Q

# The last migration number of each of the project's apps at release b66868b (bench/upgrade.py
# PREVIOUS_RELEASE), when migrations began to be checked. Every installed database applied those
# long ago (or applies them at install, on empty tables, where no lock matters), so CI checks only
# the migrations after them: linting history would only ask to rewrite what already ran.
CHECKED_AFTER = {"broker": 7, "consumers": 11, "jobs": 22}  # an app not named here: checked from its 0001
ROOT = Path(__file__).resolve().parent.parent  # the repository: its top-level packages are the project's apps

BIG_ROWS = 10_000  # a scan or rewrite under a blocking lock of a table this big is not online-safe
BLOCKING = {"SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"}  # block writes (or all access)
UNKNOWN = "unknown"  # the lock and effect of a statement upgrade_locks.tsv does not list

_T = r"(?:ONLY\s+)?(?P<table>\"?[\w.]+\"?)"
# (leading words, lock, what it does while holding it): broker/upgrade_locks.tsv
RULES_FILE = Path(__file__).with_name("upgrade_locks.tsv")


def _rules_load() -> list[tuple[str, str, str]]:
    """(pattern, lock, effect) per line of ``upgrade_locks.tsv`` (the table of locks is data)."""
    rules = []
    for line in RULES_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            pattern, lock, effect = line.split("\t")
            rules.append((pattern.replace("{table}", _T), lock, effect))
    return rules


RULES = _rules_load()
_RULES = [(re.compile(r"^\s*" + pattern, re.IGNORECASE | re.DOTALL), lock, effect) for pattern, lock, effect in RULES]


@dataclass
class Step:
    """One statement of a migration and the lock it takes."""

    sql: str
    lock: str
    effect: str
    table: str = ""
    rows: int | None = None
    size: int | None = None

    @property
    def blocking(self) -> bool:
        """Whether it blocks traffic for longer than a catalog change: a blocking lock held for a
        scan or a rewrite of an existing table with more than ``BIG_ROWS`` rows, or a data change
        over such a table in one statement."""
        if self.effect == UNKNOWN:
            return True  # whatever the table: unsafe until listed
        if self.effect == "instant" or self.lock.endswith("(new table)") or self.lock == "none":
            return False
        if self.lock not in BLOCKING and self.effect != "rows":
            return False
        return (self.rows or 0) > BIG_ROWS

    def describe(self) -> str:
        where = f" on {self.table}" if self.table else ""
        if self.rows is not None:
            where += f" ({self.rows:,} rows, {self.size / 2**20:,.1f} MiB)"
        how = {"instant": "a catalog change, bounded by the 2 s lock timeout",
               "scan": "for a scan of the table", "rewrite": "for a rewrite of the table",
               "rows": "row locks while the statement runs",
               UNKNOWN: "a statement broker/upgrade_locks.tsv does not list: unsafe until listed"}[self.effect]
        return f"{self.lock}{where}: {how}"


@dataclass
class Plan:
    """A pending migration: its steps, the library's warnings, its data migrations."""

    app: str
    name: str
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    python: int = 0  # RunPython operations (not analysed)

    @property
    def label(self) -> str:
        return f"{self.app}.{self.name}"

    @property
    def online_safe(self) -> bool:
        return not self.warnings and not self.python and not any(s.blocking for s in self.steps)

    @property
    def verdict(self) -> str:
        if self.warnings or any(s.blocking for s in self.steps):
            return "no"
        return "review (RunPython)" if self.python else "yes"

    def problems(self) -> list[str]:
        """What CI refuses in a new migration whatever the tables hold today: an operation the
        library cannot make safe, a scan or rewrite of an existing table under a lock that blocks
        writes, an UPDATE or DELETE over an existing table in one statement (batch it in code)."""
        created = {s.table for s in self.steps if s.lock.endswith("(new table)")}
        found = [f"unsafe operation: {w}" for w in self.warnings]
        for step in self.steps:
            if step.effect == UNKNOWN:
                found.append(f"not in broker/upgrade_locks.tsv (unsafe until listed): {' '.join(step.sql.split())[:160]}")
                continue
            if step.table in created:
                continue
            if (step.lock in BLOCKING and step.effect in ("scan", "rewrite")) or step.effect == "rows":
                found.append(f"{step.lock} on {step.table} for a {step.effect}: {' '.join(step.sql.split())[:160]}")
        return found

    @property
    def strongest(self) -> Step | None:
        order = ["none", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE",
                 "ACCESS EXCLUSIVE", UNKNOWN]
        ranked = [s for s in self.steps if s.lock in order]
        return max(ranked, key=lambda s: (s.blocking, order.index(s.lock), s.rows or 0), default=None)


def step_of(sql: str) -> Step:
    """The lock a statement takes (PostgreSQL's documented one for its command)."""
    for pattern, lock, effect in _RULES:
        found = pattern.match(sql)
        if found:
            table = (found.groupdict().get("table") or "").strip('"')
            return Step(sql=sql, lock=lock, effect=effect, table=table.split(".")[-1])
    return Step(sql=sql, lock=UNKNOWN, effect=UNKNOWN)  # unsafe until upgrade_locks.tsv lists it


def migration_plan(executor: MigrationExecutor, migration) -> Plan:
    """The statements ``migration`` would run (the schema editor's online forms) with the library's
    warnings about operations it cannot make safe."""
    plan = Plan(app=migration.app_label, name=migration.name,
                python=sum(isinstance(op, RunPython) for op in migration.operations))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnsafeOperationWarning)
        statements = executor.loader.collect_sql([(migration, False)])
    plan.warnings = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, UnsafeOperationWarning)]
    plan.steps = [step_of(s) for s in statements if s.strip() and not s.lstrip().startswith("--")]
    return plan


def pending_plans(*, sizes: bool = True) -> list[Plan]:
    """Every migration not yet applied to the database, in the order ``migrate`` runs them, with
    the current size of each table they touch."""
    executor = MigrationExecutor(connection)
    graph, applied = executor.loader.graph, executor.loader.applied_migrations
    keys: list = []
    for target in graph.leaf_nodes():
        keys += [key for key in graph.forwards_plan(target) if key not in applied and key not in keys]
    plans = [migration_plan(executor, graph.nodes[key]) for key in keys]
    if sizes:
        tables = sorted({s.table for p in plans for s in p.steps if s.table})
        found = relation_sizes(tables)
        for step in (s for p in plans for s in p.steps):
            if step.table in found:
                step.rows, step.size = found[step.table]
    return plans


def relation_sizes(tables: list[str]) -> dict[str, tuple[int, int]]:
    """table -> (rows, bytes) from the catalogs (pg_class, pg_stat_user_tables)."""
    if not tables:
        return {}
    with connection.cursor() as cur:
        cur.execute(Q.relation_sizes.sql, [tables])
        return {name: (rows, size) for name, rows, size in cur.fetchall()}


def transactions_long(seconds: int = 30) -> list[tuple]:
    """Sessions in a transaction for more than ``seconds``: (pid, application, seconds, state, query)."""
    with connection.cursor() as cur:
        cur.execute(Q.transactions_long.sql, [seconds])
        return cur.fetchall()


def project_apps() -> list[str]:
    """The labels of this project's installed apps that have migrations: every app whose package
    is a top-level folder of the repository (third-party apps live in site-packages). Derived from
    ``INSTALLED_APPS``, so an app added later is checked without being named anywhere."""
    found = []
    for config in apps.get_app_configs():
        top = ROOT / config.name.split(".")[0]
        if (top / "__init__.py").is_file() and Path(config.path).resolve().is_relative_to(top.resolve()) \
                and (Path(config.path) / "migrations" / "__init__.py").is_file():
            found.append(config.label)
    return sorted(found)


def is_checked(app_label: str, name: str) -> bool:
    """Whether CI checks this migration: one of the project's apps', numbered after its
    ``CHECKED_AFTER`` baseline (every migration of an app without one)."""
    number = re.match(r"^(\d+)_", name)
    return (bool(number) and app_label in project_apps()
            and int(number.group(1)) > CHECKED_AFTER.get(app_label, 0))
