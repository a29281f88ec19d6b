"""Every named statement of every registry parses on each PostgreSQL ``make test`` runs the plan
tests on (PostgreSQL 15 included: a subquery in FROM without an alias is accepted only from 16, and
one slipped into the pull claim): each is PREPAREd, in a transaction rolled back. Only a syntax
error fails (a parameter whose type the statement leaves to its caller is no error here)."""

from __future__ import annotations

import importlib
import re

import psycopg
import pytest
from django.db import connection, transaction

from jobs.ops.plans import REGISTRIES

pytestmark = pytest.mark.django_db(transaction=True)

_PARAM = re.compile(r"%\((\w+)\)s|%s")


def _numbered(sql: str) -> str:
    names: list[str] = []
    count = [0]

    def number(m):
        if m.group(1) is None:  # positional
            count[0] += 1
            return f"${count[0]}"
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return _PARAM.sub(number, sql).replace("%%", "%")


_PREPARABLE = re.compile(r"\s*(WITH|SELECT|INSERT|UPDATE|DELETE|VALUES)\b", re.I)  # (not SET, BEGIN, ...)
STATEMENTS = [(f"{app}:{q.name}", q) for app in REGISTRIES
              for q in importlib.import_module(f"{app}.queries").ALL.values() if _PREPARABLE.match(q.sql)]


@pytest.mark.parametrize("name,query", STATEMENTS, ids=[n for n, _ in STATEMENTS])
def test_statement_parses(name, query):
    sql = _numbered(query.sql)
    with transaction.atomic(), connection.cursor() as cur:
        raw = cur.connection
        try:
            with raw.transaction():
                raw.execute(f"PREPARE parse_check AS {sql}")
                raw.execute("DEALLOCATE parse_check")
        except psycopg.errors.SyntaxError as exc:
            pytest.fail(f"{name}: {exc}")
        except psycopg.Error:
            pass  # types, functions of the caller's parameters: not this test's business
        transaction.set_rollback(True)
    assert sql.strip()


def test_a_syntax_error_is_caught():
    """The check can fail: the pull claim's fault (an unaliased subquery) is one on PostgreSQL 15,
    and plain nonsense is one everywhere."""
    with transaction.atomic(), connection.cursor() as cur:
        raw = cur.connection
        with pytest.raises(psycopg.errors.SyntaxError):
            with raw.transaction():
                raw.execute("PREPARE parse_check AS SELECT FROM WHERE")
        transaction.set_rollback(True)
