"""Every benchmark script still runs: ``python bench/<name>.py --smoke`` as a subprocess (tiny
sizes, the same code paths), which must exit 0 and print its table.

Scripts are found by globbing ``bench/*.py``, so a new one is covered at once; each follows the
convention in ``bench/common.py`` (``--smoke`` through ``smoke_args_parse``, a ``SMOKE_TABLE``
regular expression for its printed table, ``SMOKE_NEEDS = ("spark",)`` when it starts Spark).
Each script gets a fresh database on the test session's PostgreSQL (no server start per script).
The selected scripts run three at a time (``SMOKE_PARALLEL``: they mostly wait on the servers they
start), the longest first, started together by a module fixture; each test then checks its own script's run. A script
whose every line a system test already runs (``SMOKE_COVERED_BY``: that test's path, which must
name the script) is not run again here.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.pipeline.spark.prerequisites import spark_prerequisites_require
from tests.processes import ROOT
from tests.source_ast import parse_source

HELPERS = {"__init__.py", "common.py"}
TIMEOUT_S = 240  # per script; a smoke run takes seconds (Spark start-up aside)
SMOKE_PARALLEL = 3
# the longest smoke runs first (they bound the module's wall time; the short ones fill in beside them)
LONGEST_FIRST = ("growth.py", "capacity.py", "scale.py")


def bench_scripts() -> list[Path]:
    return sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in HELPERS)


def module_constant(path: Path, name: str):
    """A literal module-level constant of a script, read without importing it."""
    for node in parse_source(path.read_text(), str(path)).body:
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


def _smoke(script: Path, template: str) -> tuple[int, str, str, float]:
    with scratch_database(f"bench_smoke_{script.stem}_{os.getpid()}", template=template) as url:
        return _run([sys.executable, str(script), "--smoke"], _child_env(url))


@pytest.fixture(scope="module")
def smoke_runs(request, migrated_template):
    """Every selected script's smoke run, started at once on a small pool: {script name: Future}."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if item.originalname == "test_bench_script_smoke" and hasattr(item, "callspec")]
    runnable = [p for p in selected if not module_constant(p, "SMOKE_COVERED_BY")
                and ("spark" not in (module_constant(p, "SMOKE_NEEDS") or ()) or _spark_ready())]
    runnable.sort(key=lambda p: (p.name not in LONGEST_FIRST, LONGEST_FIRST.index(p.name) if p.name in LONGEST_FIRST else 0))
    with ThreadPoolExecutor(SMOKE_PARALLEL) as pool:
        yield {p.name: pool.submit(_smoke, p, migrated_template) for p in runnable}


def _spark_ready() -> bool:
    try:
        spark_prerequisites_require()
        return True
    except pytest.skip.Exception:
        return False


@pytest.mark.parametrize("script", [_param(p) for p in bench_scripts()])
def test_bench_script_smoke(script: Path, smoke_runs):
    pattern = module_constant(script, "SMOKE_TABLE")
    assert pattern, f"{script.name} defines no SMOKE_TABLE (the convention in bench/common.py)"
    covered_by = module_constant(script, "SMOKE_COVERED_BY")
    if covered_by:  # a system test runs the script itself: it must, by name
        assert f"bench/{script.name}" in (ROOT / covered_by).read_text(), f"{covered_by} does not run {script.name}"
        return
    if "spark" in (module_constant(script, "SMOKE_NEEDS") or ()):
        spark_prerequisites_require()
    code, out, err, seconds = smoke_runs[script.name].result()
    print(f"{script.name} --smoke: exit {code} in {seconds:.1f} s")
    tail = f"\n--- stdout (end) ---\n{out[-3000:]}\n--- stderr (end) ---\n{err[-3000:]}"
    assert code == 0, f"{script.name} --smoke exited {code}{tail}"
    assert re.search(pattern, out, re.MULTILINE), f"{script.name} --smoke printed no table matching {pattern!r}{tail}"
