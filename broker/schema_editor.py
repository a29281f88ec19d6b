"""How migrations run against a live database: django-pg-zero-downtime-migrations' schema editor
(``broker.db.backend``'s ``SchemaEditorClass``), with a short lock timeout on every statement that
may block traffic and retries when it passes.

Why a library: django-pg-zero-downtime-migrations (maintained, PostgreSQL 14 to 18, Django 4.2 to
6.1) rewrites Django's schema operations into their online forms: ``CREATE INDEX CONCURRENTLY`` (and
``DROP INDEX CONCURRENTLY``), constraints and foreign keys added ``NOT VALID`` then validated under a
SHARE UPDATE EXCLUSIVE lock, NOT NULL through a validated CHECK, unique constraints ``USING INDEX``
built concurrently; it runs a migration's statements one by one outside a transaction (so no lock
is held longer than its statement) and bounds the statements that take an ACCESS EXCLUSIVE lock with
``lock_timeout``/``statement_timeout``. It warns about the operations it cannot make safe (a volatile
type change, a column renamed, a NOT NULL column without ``db_default``); CI fails on those
(tests/system/upgrade/test_migrations.py, with django-migration-linter).

What this module adds (the library neither retries nor bounds raw ``RunSQL``):
- every statement of a migration runs under ``lock_timeout = LOCK_TIMEOUT`` (the library's own
  ACCESS EXCLUSIVE statements and ``RunSQL`` alike), except those that only take a SHARE UPDATE
  EXCLUSIVE lock (``CREATE/DROP INDEX CONCURRENTLY``, ``VALIDATE CONSTRAINT``), which block no
  reads or writes and may wait as long as they need;
- a statement whose lock was not granted in time (a long transaction ahead of it: waiting longer
  would queue every publish and pull behind it), or that PostgreSQL chose as a deadlock's victim
  (it locks two tables, e.g. a foreign key's both ends, and a live statement holds the second and
  waits for the first), is retried after a pause, ``LOCK_ATTEMPTS`` times in all, then the
  migration fails (run it again later; docs/upgrades.md). A retry is safe: the statement ran
  outside a transaction, so its abort released whatever it had locked.
No cost outside migrations: a schema editor exists only while ``migrate`` (or ``sqlmigrate``) runs.
"""

from __future__ import annotations

import logging
import re
import time

import psycopg
from django.db.backends.postgresql.schema import DatabaseSchemaEditor as PostgresSchemaEditor
from django.db.utils import OperationalError
from django_zero_downtime_migrations.backends.postgres.schema import DatabaseSchemaEditorMixin

from broker.queries import Q

logger = logging.getLogger("broker.migrations")

LOCK_TIMEOUT = "2s"  # how long a migration statement may wait for its lock (traffic queues behind it meanwhile)
STATEMENT_TIMEOUT = "2s"  # an ACCESS EXCLUSIVE statement's own run time (the library's setting)
LOCK_ATTEMPTS = 10  # tries of a statement whose lock was not granted in time
RETRY_PAUSES = (1.0, 2.0, 4.0, 8.0)  # seconds before retry 1, 2, 3, and every later one
# Statements that take only a SHARE UPDATE EXCLUSIVE lock: they never block reads or writes.
ONLINE = re.compile(r"^\s*(CREATE\s+(UNIQUE\s+)?INDEX\s+CONCURRENTLY|DROP\s+INDEX\s+CONCURRENTLY|"
                    r"REINDEX\s+(INDEX|TABLE)\s+CONCURRENTLY|ALTER\s+TABLE\s+\S+\s+VALIDATE\s+CONSTRAINT)",
                    re.IGNORECASE)


def _lock_not_granted(exc: BaseException) -> bool:
    """Its lock wait passed ``lock_timeout``, or it was a deadlock's victim (CI saw one: a foreign
    key dropped under traffic while a publish held the referenced table and waited for jobs_job)."""
    return isinstance(exc.__cause__, (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected))


def _why(exc: BaseException) -> str:
    if isinstance(exc.__cause__, psycopg.errors.DeadlockDetected):
        return "a deadlock's victim"
    return f"waited {LOCK_TIMEOUT}"


class _Retrying:
    """Below the library's statement loop: one statement at a time, with the lock policy above."""

    def execute(self, sql, params=()):
        if self.collect_sql or self.connection.in_atomic_block:
            return super().execute(sql, params)  # sqlmigrate; or a RunPython transaction (not retried)
        online = bool(ONLINE.match(str(sql)))
        if online:
            self._lock_timeout_set("0")
        try:
            for attempt in range(1, LOCK_ATTEMPTS + 1):
                try:
                    return super().execute(sql, params)
                except OperationalError as exc:
                    if not _lock_not_granted(exc) or attempt == LOCK_ATTEMPTS:
                        raise
                    pause = RETRY_PAUSES[min(attempt, len(RETRY_PAUSES)) - 1]
                    logger.warning("migration statement did not get its lock (%s; attempt %d of %d); retrying in %g s: "
                                   "%s", _why(exc), attempt, LOCK_ATTEMPTS, pause, str(sql)[:200])
                    time.sleep(pause)
        finally:
            if online:
                self._lock_timeout_set(LOCK_TIMEOUT)

    def _lock_timeout_set(self, value: str | None) -> None:
        """The session's lock_timeout (None: back to the server's default)."""
        with self.connection.cursor() as cursor:
            cursor.execute(Q.settings_session_set.sql, {"names": ["lock_timeout"], "values": [value]})


class BrokerSchemaEditor(DatabaseSchemaEditorMixin, _Retrying, PostgresSchemaEditor):
    """The library's editor (settings as class attributes: settings.py stays free of them), with
    every statement under ``LOCK_TIMEOUT`` and retried (``_Retrying``). Unsafe operations warn
    (``UnsafeOperationWarning``) instead of raising, so the historical migrations and third-party
    apps still install; CI refuses new unsafe ones."""

    def __init__(self, connection, collect_sql=False, atomic=True):
        super().__init__(connection, collect_sql=collect_sql, atomic=atomic)
        self.LOCK_TIMEOUT = LOCK_TIMEOUT
        self.STATEMENT_TIMEOUT = STATEMENT_TIMEOUT
        self.FLEXIBLE_STATEMENT_TIMEOUT = True  # CONCURRENTLY builds and VALIDATE run as long as they need
        self.RAISE_FOR_UNSAFE = False

    def __enter__(self):
        editor = super().__enter__()
        if not self.collect_sql:
            self._lock_timeout_set(LOCK_TIMEOUT)
        return editor

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            if not self.collect_sql and not self.connection.in_atomic_block and self.connection.connection is not None:
                try:
                    self._lock_timeout_set(None)
                except Exception:  # noqa: BLE001 - a broken connection is dropped anyway
                    pass
