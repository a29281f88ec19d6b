"""``manage.py broker_upgrade_check`` against the live database: pending migrations with their
online-safety and strongest lock (table sizes from the catalogs), and the long transactions a
migration would wait behind."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import CommandError, call_command
from django.db.migrations.recorder import MigrationRecorder

from broker.db.listen import dedicated_connect

pytestmark = pytest.mark.django_db


def _check(*args) -> str:
    out = io.StringIO()
    call_command("broker_upgrade_check", *args, stdout=out)
    return out.getvalue()


def _pending(app: str, name: str) -> None:
    """Make an applied migration pending again (the test's transaction puts the record back)."""
    assert MigrationRecorder.Migration.objects.filter(app=app, name=name).delete()[0] == 1


def test_nothing_pending_on_a_migrated_database():
    out = _check("--long-transaction", "3600")
    assert "no pending migrations" in out and "no transaction open longer than 3600 s" in out


def test_a_pending_migration_with_its_lock_and_the_table_size(make):
    make.basics().consumer("c1")
    for _ in range(3):
        make.publish()
    _pending("jobs", "0021_job_receipt")  # ADD COLUMN receipt (nullable), CREATE SEQUENCE
    out = _check()
    line = next(l for l in out.splitlines() if l.startswith("jobs.0021_job_receipt"))
    assert "online-safe: yes" in line, out
    assert "lock: ACCESS EXCLUSIVE on jobs_job (" in line and "rows" in line and "MiB): a catalog change" in line, out
    assert "every statement waits at most 2s for its lock" in out


def test_an_unsafe_pending_migration_fails_strict():
    _pending("consumers", "0003_priority_groups")  # NOT NULL columns with a code default only
    out = _check()
    assert "consumers.0003_priority_groups  online-safe: no" in out, out
    assert "unsafe: ADD COLUMN NOT NULL is unsafe operation" in out
    with pytest.raises(CommandError, match="not online-safe"):
        _check("--strict")


def test_long_transactions_are_listed():
    reader = dedicated_connect(application_name="test-long-reader")
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT 1")
        time.sleep(1.2)
        out = _check("--long-transaction", "1")
    finally:
        reader.close()
    assert any(l.startswith("long transaction: pid ") and "(test-long-reader)" in l for l in out.splitlines()), out
