"""A prepared statement outlives a migration that changes the type of a column it returns: the
server then refuses it ("cached plan must not change result type") for as long as the session
keeps it. ``broker.db.run`` drops the session's prepared statements and runs it again (outside a
transaction); inside one, the error is a "try again" (503 with Retry-After) and the rollback
drops them, so the next transaction runs. Against a real ``ALTER TABLE`` from another session, as
``migrate`` would run it beside a serving process."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from broker.db.errors import database_unavailable
from broker.db.listen import dedicated_connect
from broker.db.run import plan_changed, query_fetchall, query_fetchone

pytestmark = pytest.mark.django_db(transaction=True)

SELECT = "SELECT id, amount FROM test_plan_probe WHERE id >= %(id)s::bigint ORDER BY id"


@pytest.fixture
def table():
    other = dedicated_connect(application_name="test-migrate")
    other.execute("CREATE TABLE test_plan_probe (id bigint PRIMARY KEY, amount integer)")
    other.execute("INSERT INTO test_plan_probe VALUES (1, 10), (2, 20)")
    try:
        yield other
    finally:
        other.execute("DROP TABLE IF EXISTS test_plan_probe")
        other.close()


def _prepared_names() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cur.fetchall()}


def test_a_prepared_statement_is_run_again_after_its_result_type_changed(table):
    assert query_fetchall(SELECT, {"id": 1}, prepare=True) == [(1, 10), (2, 20)]
    assert query_fetchone(SELECT, {"id": 2}, prepare=True) == (2, 20)  # (the prepared statement reused)
    assert _prepared_names(), "the statement is prepared on the server"
    backend = connection.connection.info.backend_pid
    with connection.cursor() as cur:
        cur.execute("SET application_name = 'kept-session'")

    table.execute("ALTER TABLE test_plan_probe ALTER COLUMN amount TYPE bigint")  # the migration, elsewhere

    assert query_fetchall(SELECT, {"id": 1}, prepare=True) == [(1, 10), (2, 20)]  # dropped, prepared again
    assert query_fetchone(SELECT, {"id": 1}, prepare=True) == (1, 10)  # and it stays usable
    assert connection.connection.info.backend_pid == backend, "the same session (its locks and settings kept)"
    with connection.cursor() as cur:
        cur.execute("SHOW application_name")
        assert cur.fetchone()[0] == "kept-session"


def test_in_a_transaction_the_error_says_try_again_and_the_next_one_runs(table):
    assert query_fetchone(SELECT, {"id": 1}, prepare=True) == (1, 10)
    table.execute("ALTER TABLE test_plan_probe ALTER COLUMN amount TYPE numeric")
    with pytest.raises(DatabaseError) as caught:
        with transaction.atomic():
            query_fetchone(SELECT, {"id": 1}, prepare=True)
    assert plan_changed(caught.value), caught.value
    assert database_unavailable(caught.value), "a request answers 503 with Retry-After, a loop goes on"
    with transaction.atomic():  # the rollback dropped the statement
        assert query_fetchone(SELECT, {"id": 1}, prepare=True) == (1, 10)


def test_other_errors_are_not_retried(table):
    assert query_fetchone(SELECT, {"id": 1}, prepare=True) == (1, 10)
    table.execute("DROP TABLE test_plan_probe")
    with pytest.raises(DatabaseError) as caught:
        query_fetchone(SELECT, {"id": 1}, prepare=True)
    assert not plan_changed(caught.value) and not database_unavailable(caught.value)
