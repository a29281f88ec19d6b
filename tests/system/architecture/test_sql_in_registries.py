"""Every SQL statement lives in its app's registry (``<app>/queries.sql``, loaded by name through
``broker.db.queries``), never as a string in Python: no statement literal, and none assembled
with an f-string, ``%`` or ``.format()``, in the .py files of broker, eventtypes, consumers, jobs, pipeline, sources and web.

A statement here is a string (docstrings aside: they may quote SQL to explain it) holding an
upper-case ``SELECT``, ``UPDATE ... SET``, ``INSERT INTO``, ``DELETE FROM``, ``SET <name> =`` or
``LISTEN``; an f-string is read with each placeholder as ``{}``. Migrations are history and keep
their SQL. Exceptions, each with its reason: ``ALLOWED``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.source_ast import parse_source

ROOT = Path(__file__).resolve().parents[3]
APPS = ("broker", "eventtypes", "consumers", "jobs", "pipeline", "sources", "web")

STATEMENT = re.compile(r"\bSELECT\s+\S|\bUPDATE\s+\S+\s+SET\b|\bINSERT\s+INTO\b|\bDELETE\s+FROM\b"
                       r"|\bSET\s+\w+\s*(=|TO\b)|\bLISTEN\s+\S")

ALLOWED = {
    ("broker/embedded_db.py", "SELECT 1 FROM pg_database WHERE datname = %s"):
        "the embedded PostgreSQL bootstrap runs before Django is set up: no registry is loaded yet",
    ("broker/db/listen.py", "LISTEN {}"):
        "LISTEN takes an identifier, not a parameter; the channel names are code constants",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def sql_literals(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, text) of every string of ``source`` that holds a SQL statement (f-strings with
    ``{}`` for each placeholder), docstrings aside."""
    tree = parse_source(source, filename)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        else:
            continue
        if STATEMENT.search(text):
            found.append((node.lineno, text))
    return sorted(found)


def test_no_sql_statement_outside_the_registries():
    offenders, used = [], set()
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "migrations" in path.relative_to(ROOT).parts:
                continue
            for line, text in sql_literals(path.read_text(), relative):
                if (relative, text) in ALLOWED:
                    used.add((relative, text))
                else:
                    offenders.append(f"{relative}:{line}: {text[:100]!r}")
    assert not offenders, ("SQL in Python (move it to the app's queries.sql and run it by name):\n"
                           + "\n".join(offenders))
    assert used == set(ALLOWED), f"exceptions no longer needed (remove them): {set(ALLOWED) - used}"


def test_the_scan_finds_literals_and_formatted_statements_but_not_docstrings():
    source = ('"""SELECT x FROM t in a docstring is prose."""\n'
              'A = "SELECT id FROM jobs_job WHERE id = %s"\n'
              'def f(table, cols):\n'
              '    """UPDATE t SET a = 1 explained."""\n'
              '    sql = f\'UPDATE "{table}" SET {cols} WHERE id = %s\'\n'
              '    return conn.execute("SELECT 1"), f"LISTEN {table}", "DELETE FROM x", "SET plan_cache_mode = auto"\n'
              'B = "a SELECTION of text", "select it in the list", "Update settings"\n')
    assert sql_literals(source) == [
        (2, "SELECT id FROM jobs_job WHERE id = %s"),
        (5, 'UPDATE "{}" SET {} WHERE id = %s'),
        (6, "DELETE FROM x"),
        (6, "LISTEN {}"),
        (6, "SELECT 1"),
        (6, "SET plan_cache_mode = auto"),
    ]
