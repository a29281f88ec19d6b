"""Every benchmark script still runs: ``python bench/<name>.py --smoke`` as a subprocess (tiny
sizes, the same code paths), which must exit 0 and print its table.

Scripts are found by globbing ``bench/*.py``, so a new one is covered at once; each follows the
convention in ``bench/common.py`` (``--smoke`` through ``smoke_args_parse``, a ``SMOKE_TABLE``
regular expression for its printed table, ``SMOKE_NEEDS = ("spark",)`` when it starts Spark).
Each script gets a fresh database on the test session's PostgreSQL (no server start per script).
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.pipeline.spark.prerequisites import spark_prerequisites_require
from tests.processes import ROOT

HELPERS = {"__init__.py", "common.py"}
TIMEOUT_S = 240  # per script; a smoke run takes seconds (Spark start-up aside)


def bench_scripts() -> list[Path]:
    return sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in HELPERS)


def module_constant(path: Path, name: str):
    """A literal module-level constant of a script, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _param(path: Path):
    marks = [pytest.mark.spark] if "spark" in (module_constant(path, "SMOKE_NEEDS") or ()) else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_every_script_is_found():
    """The glob sees the scripts the README lists (a broken glob would pass vacuously)."""
    names = {p.name for p in bench_scripts()}
    assert {"publish.py", "pull.py", "push.py", "pipeline.py", "dashboard.py", "soak.py", "scale.py"} <= names


def _server_admin() -> dict:
    """Connection keywords for the test session's PostgreSQL server (its maintenance database)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {"host": db.get("HOST") or "127.0.0.1", "port": db.get("PORT") or 5432,
            "user": db.get("USER") or "postgres", "password": db.get("PASSWORD") or None, "dbname": "postgres"}


def _url(database: str) -> str:
    """The test session's database URL with ``database`` in place of its name (broker.db.urls:
    the password percent-encoded, every host kept)."""
    from django.conf import settings

    from broker.db.urls import database_url_render

    return database_url_render(settings.DATABASES["default"], dbname=database)


def _run(args: list[str], env: dict) -> tuple[int, str, str, float]:
    """Run in its own process group; past the timeout SIGINT it (so the script's ``finally``
    stops the servers it started), then SIGKILL the group."""
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        err += f"\n[killed after {TIMEOUT_S} s]"
    return proc.returncode, out, err, time.monotonic() - started


@contextmanager
def scratch_database(name: str, *, template: str | None = None):
    """A new database on the test session's server (a copy of ``template`` if given), dropped after."""
    import psycopg

    admin = _server_admin()
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(autocommit=True, **admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield _url(name)
    finally:
        with psycopg.connect(autocommit=True, **admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def migrated_template():
    """A database migrated once, copied for each script (so each script's own ``migrate`` is a
    quick no-op)."""
    name = f"bench_smoke_template_{os.getpid()}"
    with scratch_database(name) as url:
        code, out, err, _ = _run([sys.executable, "manage.py", "migrate", "-v0"], _child_env(url))
        assert code == 0, f"migrate failed:\n{out[-2000:]}\n{err[-3000:]}"
        yield name


def _child_env(database_url: str) -> dict:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SECRET_KEY": "bench-smoke-secret-key",
           "BROKER_TESTING": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


@pytest.mark.parametrize("script", [_param(p) for p in bench_scripts()])
def test_bench_script_smoke(script: Path, migrated_template: str):
    pattern = module_constant(script, "SMOKE_TABLE")
    assert pattern, f"{script.name} defines no SMOKE_TABLE (the convention in bench/common.py)"
    if "spark" in (module_constant(script, "SMOKE_NEEDS") or ()):
        spark_prerequisites_require()
    with scratch_database(f"bench_smoke_{script.stem}_{os.getpid()}", template=migrated_template) as url:
        code, out, err, seconds = _run([sys.executable, str(script), "--smoke"], _child_env(url))
    print(f"{script.name} --smoke: exit {code} in {seconds:.1f} s")
    tail = f"\n--- stdout (end) ---\n{out[-3000:]}\n--- stderr (end) ---\n{err[-3000:]}"
    assert code == 0, f"{script.name} --smoke exited {code}{tail}"
    assert re.search(pattern, out, re.MULTILINE), f"{script.name} --smoke printed no table matching {pattern!r}{tail}"
