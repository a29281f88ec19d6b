"""Safe migrations, enforced (docs/upgrades.md "Writing a migration"): every migration of every app of
the project (``broker.upgrades.project_apps``: the installed apps whose code is in this repository)
numbered after ``broker.upgrades.CHECKED_AFTER`` must be online-safe by three maintained tools and the
lock table:

- django-pg-zero-downtime-migrations (the schema editor ``migrate`` runs with,
  ``broker.schema_editor``): no ``UnsafeOperationWarning``, and no statement of its online forms that
  scans or rewrites an existing table under a lock blocking writes, nor an UPDATE/DELETE over one;
- django-migration-linter: no backward-incompatible change (a column dropped or renamed, a NOT NULL
  column without a default, a type change: old code still runs against the new schema during a
  rolling deploy) and no index built or dropped without CONCURRENTLY;
- squawk (``squawk-cli``, a maintained PostgreSQL migration linter) over the editor's statements,
  its safety rules (``SQUAWK_OFF`` lists the style rules left out, and why);
- ``broker/upgrade_locks.tsv``: a statement it does not list is unsafe until listed.

An exception is a migration that contains ``IgnoreMigration()`` (django-migration-linter's marker)
and a ``# safe: <why>`` comment. Sample migrations show each check catching what it must (a check
that cannot fail proves nothing) and the editor's online forms, lock timeout and retries at work."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection, models
from django.db.migrations import AddConstraint, AddField, AddIndex, AlterField, Migration, RemoveField, RunSQL
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django_migration_linter import MigrationLinter
from django_migration_linter.operations import IgnoreMigration
from django_migration_linter.sql_analyser.analyser import analyse_sql_statements
from django_migration_linter.sql_analyser.postgresql import PostgresqlAnalyser

from broker import schema_editor
from broker.upgrades import CHECKED_AFTER, ROOT, is_checked, migration_plan, project_apps

# the linter's lock warnings count as errors (its backward-compatibility checks are errors already)
LOCK_CHECKS = ["CREATE_INDEX", "CREATE_INDEX_EXCLUSIVE", "DROP_INDEX", "REINDEX"]
SQUAWK = Path(sys.executable).with_name("squawk")  # the binary the squawk-cli wheel installs
SQUAWK_OFF = [  # squawk's rules left out, each for a reason; the others (locks, rewrites, compatibility) count
    "require-lock-timeout", "require-statement-timeout",  # the editor sets both per statement (broker.schema_editor)
    "prefer-robust-stmts",  # IF NOT EXISTS: the editor retries a statement whose lock was not granted, not a half-run one
    "prefer-bigint-over-int", "prefer-bigint-over-smallint", "prefer-text-field", "prefer-identity",  # style: Django's types
    "prefer-timestamptz",  # style (Django writes timestamptz with USE_TZ)
]


def squawk_issues(sql: list[str]) -> list[str]:
    """squawk's findings (rule: message) for these statements, its style rules left out."""
    text = "".join(statement.strip().rstrip(";") + ";\n" for statement in sql)
    run = subprocess.run([str(SQUAWK), "--reporter", "json", "--stdin-filepath", "migration.sql",
                          "--exclude", ",".join(SQUAWK_OFF)], input=text, capture_output=True, text=True, timeout=60)
    if run.returncode not in (0, 1) or not run.stdout.strip():
        raise AssertionError(f"squawk failed (exit {run.returncode}): {run.stderr[-2000:]}")
    return [f"squawk {v['rule_name']}: {v['message']}" for v in json.loads(run.stdout)]


def checked_migrations():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return sorted((m for (app, name), m in loader.disk_migrations.items() if is_checked(app, name)),
                  key=lambda m: (m.app_label, m.name))


def excepted(migration) -> bool:
    """A checked migration that carries the linter's ``IgnoreMigration()`` marker, which needs a
    ``# safe:`` comment saying why (asserted by the test below)."""
    return any(isinstance(op, IgnoreMigration) for op in migration.operations)


def linter_issues(sql: list[str], migration) -> list[str]:
    """django-migration-linter's errors (lock warnings included) for these statements."""
    errors, _, warnings = analyse_sql_statements(PostgresqlAnalyser, sql, [])
    data_errors, _, _ = MigrationLinter(no_cache=True, no_output=True, analyser_string="postgresql").analyse_data_migration(migration)
    return [f"{i.code}: {i.message}" for i in errors + data_errors + [w for w in warnings if w.code in LOCK_CHECKS]]


def test_every_installed_app_with_migrations_is_checked():
    """The apps checked are every installed app of this repository that has migrations, found
    here another way (the migration loader's apps whose module file is in the repository, not in
    a virtualenv): an app left out of ``project_apps`` (the portal once was) fails here."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    ours = set()
    for label in loader.migrated_apps:
        module = Path(apps.get_app_config(label).module.__file__).resolve()
        if module.is_relative_to(ROOT.resolve()) and "site-packages" not in module.parts:
            ours.add(label)
    assert ours, "no app of this repository has migrations?"
    assert set(project_apps()) == ours, f"apps with migrations not checked: {sorted(ours - set(project_apps()))}"
    assert {"broker", "consumers", "jobs", "portal"} <= ours
    portal = [name for (app, name) in loader.disk_migrations if app == "portal"]
    assert portal and all(is_checked("portal", name) for name in portal), "an app without a baseline: all checked"
    assert not is_checked("django_q", "0001_initial") and not is_checked("auth", "0013_sample")


def test_the_baseline_names_the_last_migrations_of_the_previous_release():
    """CHECKED_AFTER matches the migrations on disk: nothing of the project above it is unchecked,
    and each app's baseline migration exists (a typo would check nothing)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    numbers = {}
    for app, name in loader.disk_migrations:
        if app in CHECKED_AFTER and re.match(r"^\d+_", name):
            numbers.setdefault(app, set()).add(int(name.split("_")[0]))
    for app, last in CHECKED_AFTER.items():
        assert last in numbers[app], f"{app} has no migration {last:04d}"


@pytest.mark.django_db
def test_new_migrations_are_online_safe():
    """The CI gate: every checked migration passes both tools (or is an exception with its reason)."""
    linter = MigrationLinter(no_cache=True, analyser_string="postgresql", all_warnings_as_errors=False, warnings_as_errors_tests=LOCK_CHECKS,
                             include_apps=project_apps(),
                             ignore_name=[name for (app, name) in MigrationLoader(None).disk_migrations
                                          if app in project_apps() and not is_checked(app, name)])
    executor = MigrationExecutor(connection)
    problems = []
    for migration in checked_migrations():
        if excepted(migration):
            source = Path(__import__(migration.__module__, fromlist=["_"]).__file__).read_text()
            if not re.search(r"#\s*safe:\s*\S", source):
                problems.append(f"{migration.app_label}.{migration.name}: IgnoreMigration() without a '# safe: why' comment")
            continue
        plan = migration_plan(executor, migration)
        problems += [f"{migration.app_label}.{migration.name}: {p}" for p in plan.problems()]
        problems += [f"{migration.app_label}.{migration.name}: {p}"
                     for p in squawk_issues([s.sql for s in plan.steps if not _new_table(s, plan)])]
        before = linter.nb_erroneous
        linter.lint_migration(migration)
        if linter.nb_erroneous > before:
            problems.append(f"{migration.app_label}.{migration.name}: django-migration-linter errors (printed above)")
    assert not problems, "unsafe migrations (docs/upgrades.md, 'Writing a migration'):\n" + "\n".join(problems)


def _new_table(step, plan) -> bool:
    """A statement on a table the same migration creates (no rows, no readers yet)."""
    created = {s.table for s in plan.steps if s.lock.endswith("(new table)")}
    return bool(step.table) and step.table in created


# --- the checks themselves, on sample migrations against jobs_job -----------------------------------------
def _sample(*operations, name="9999_sample") -> tuple[MigrationExecutor, Migration]:
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    parent = graph.leaf_nodes("jobs")[0]
    migration = Migration(name, "jobs")
    migration.operations = list(operations)
    migration.dependencies = [parent]
    graph.add_node(("jobs", name), migration)
    graph.add_dependency(migration, ("jobs", name), parent)
    return executor, migration


def _check(*operations):
    executor, migration = _sample(*operations)
    plan = migration_plan(executor, migration)
    return plan, linter_issues([s.sql for s in plan.steps], migration)


def _raw(sql: str) -> list:
    return [RunSQL(sql, RunSQL.noop)]


SAMPLES = {
    # name: (operations, caught by our check (editor warning or lock table), by django-migration-linter, by squawk)
    "index": ([AddIndex("job", models.Index(fields=["created_at"], name="sample_created"))], False, False, False),
    "nullable column": ([AddField("job", "sample", models.IntegerField(null=True))], False, False, False),
    "column with a database default": ([AddField("job", "sample", models.IntegerField(db_default=0))], False, False,
                                       False),
    "not null without a database default": ([AddField("job", "sample", models.IntegerField(default=0))], True, True,
                                            True),
    "type change": ([AlterField("job", "priority", models.BigIntegerField(default=0))], True, True, True),
    "column dropped (contract before expand)": ([RemoveField("job", "last_reason")], False, True, True),
    "one-statement backfill": (_raw("UPDATE jobs_job SET priority = 0"), True, False, False),
    "index without CONCURRENTLY in RunSQL": ([RunSQL("CREATE INDEX sample_raw ON jobs_job (created_at)",
                                                     "DROP INDEX sample_raw")], True, True, True),
    "stored generated column (a rewrite)": (_raw("ALTER TABLE jobs_job ADD COLUMN sample_g integer "
                                                 "GENERATED ALWAYS AS (priority * 2) STORED"), True, False, True),
    "foreign key without NOT VALID": (_raw("ALTER TABLE jobs_job ADD CONSTRAINT sample_fk FOREIGN KEY (consumer_id) "
                                           "REFERENCES consumers_consumer (id)"), True, False, True),
    "a table rewritten by CLUSTER": (_raw("CLUSTER jobs_job USING jobs_job_pkey"), True, False, False),
    "a statement the lock table does not list": (_raw("LOCK TABLE jobs_job IN EXCLUSIVE MODE"), True, False, False),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(SAMPLES))
def test_each_check_catches_what_it_must(name):
    """What each tool catches, measured (docs/upgrades.md, "Which tool"): a check that cannot fail
    proves nothing, and one tool's gap is another's catch."""
    operations, ours, linter, squawk = SAMPLES[name]
    plan, issues = _check(*operations)
    statements = [s.sql for s in plan.steps]
    assert bool(plan.problems()) == ours, (plan.problems(), statements)
    assert bool(issues) == linter, (issues, statements)
    assert bool(squawk_issues(statements)) == squawk, (squawk_issues(statements), statements)


@pytest.mark.django_db
def test_the_editor_writes_online_forms():
    """What django-pg-zero-downtime-migrations changes: indexes CONCURRENTLY, constraints NOT VALID
    then VALIDATE (Django's own editor: a plain CREATE INDEX holding SHARE for the whole build)."""
    plan, _ = _check(AddIndex("job", models.Index(fields=["created_at"], name="sample_created")))
    locks = [s for s in plan.steps if s.lock != "none"]  # (SET statement_timeout lines aside)
    assert [s.lock for s in locks] == ["SHARE UPDATE EXCLUSIVE"] and "CONCURRENTLY" in locks[0].sql
    plan, _ = _check(AddField("job", "sample", models.IntegerField(null=True)),
                     AddField("job", "sample_ok", models.BooleanField(null=True)))
    assert {s.effect for s in plan.steps} == {"instant"} and plan.problems() == []
    check = models.CheckConstraint(condition=models.Q(priority__gte=-1000), name="sample_priority")
    plan, _ = _check(AddConstraint("job", check))
    locks = [s for s in plan.steps if s.lock != "none"]
    assert [(s.lock, s.effect) for s in locks] == [("ACCESS EXCLUSIVE", "instant"), ("SHARE UPDATE EXCLUSIVE", "scan")]
    assert "NOT VALID" in locks[0].sql and "VALIDATE CONSTRAINT" in locks[1].sql
    assert plan.problems() == []


@pytest.mark.django_db(transaction=True)
def test_a_statement_waits_2_s_for_its_lock_and_is_retried(monkeypatch, caplog):
    """A transaction holding jobs_job: the migration's ALTER waits at most LOCK_TIMEOUT per try (the
    publishes queued behind it wait no longer), then goes through once the transaction ends."""
    from broker.db.listen import dedicated_connect

    monkeypatch.setattr(schema_editor, "RETRY_PAUSES", (0.2,))
    blocker = dedicated_connect(application_name="test-blocker")
    blocker.execute("BEGIN")
    blocker.execute("LOCK TABLE jobs_job IN ACCESS SHARE MODE")  # a long reader (pg_dump, a report)
    threading.Timer(3.0, lambda: blocker.execute("ROLLBACK")).start()
    started = time.monotonic()
    try:
        with caplog.at_level("WARNING", logger="broker.migrations"):
            with connection.schema_editor() as editor:
                editor.execute("ALTER TABLE jobs_job ALTER COLUMN last_reason SET DEFAULT NULL")
    finally:
        time.sleep(0.1)
        blocker.close()
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert 1 <= len(retries) <= 2, [r.getMessage() for r in caplog.records]
    assert 2.0 <= time.monotonic() - started < 8.0
    with connection.cursor() as cur:
        cur.execute("SHOW lock_timeout")
        assert cur.fetchone()[0] == "0", "the session's lock_timeout is put back after the migration"


@pytest.mark.django_db(transaction=True)
def test_a_statement_chosen_as_a_deadlocks_victim_is_retried(monkeypatch, caplog):
    """A statement that locks two tables (as dropping a foreign key locks both its ends) against a
    live transaction that holds the second and then asks for the first: PostgreSQL aborts one of the
    two; the migration's statement, aborted outside any transaction, has released its locks and is
    run again (CI's rolling upgrade failed on exactly this before the editor retried deadlocks)."""
    from broker.db.listen import dedicated_connect

    monkeypatch.setattr(schema_editor, "RETRY_PAUSES", (0.5,))
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE test_deadlock_a (x int); CREATE TABLE test_deadlock_b (x int)")
    live = dedicated_connect(application_name="test-live")
    outcome = {}

    def live_transaction():
        try:
            live.execute("BEGIN")
            live.execute("SELECT count(*) FROM test_deadlock_b")  # holds b (ACCESS SHARE) ...
            time.sleep(0.4)
            live.execute("SELECT count(*) FROM test_deadlock_a")  # ... then waits for a: the cycle
            live.execute("COMMIT")
            outcome["live"] = "committed"
        except Exception as exc:  # noqa: BLE001 - the other possible victim: recorded, not raised
            live.execute("ROLLBACK")
            outcome["live"] = type(exc).__name__

    worker = threading.Thread(target=live_transaction)
    try:
        worker.start()
        time.sleep(0.1)
        with caplog.at_level("WARNING", logger="broker.migrations"):
            with connection.schema_editor() as editor:
                # a then b, with the live transaction between the two: the migration waits first, so its
                # deadlock_timeout runs out first and it is the victim
                editor.execute("DO $$ BEGIN LOCK TABLE test_deadlock_a IN ACCESS EXCLUSIVE MODE; "
                               "PERFORM pg_sleep(0.1); LOCK TABLE test_deadlock_b IN ACCESS EXCLUSIVE MODE; END $$")
        worker.join(10)
    finally:
        live.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS test_deadlock_a, test_deadlock_b")
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 1 and "deadlock" in retries[0], [r.getMessage() for r in caplog.records]
    assert outcome["live"] == "committed"
