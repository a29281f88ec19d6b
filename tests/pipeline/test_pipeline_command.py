"""manage.py pipeline without its prerequisites: one line saying what to install, exit status 2
(no traceback from inside pyspark)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.processes import ROOT, child_env

# manage.py as a user runs it, with ``pyspark`` made unimportable (as without the spark extra)
NO_PYSPARK = ("import runpy, sys; sys.modules['pyspark'] = None; sys.modules['pyspark.sql'] = None; "
              "sys.argv = ['manage.py'] + sys.argv[1:]; runpy.run_path('manage.py', run_name='__main__')")


def pipeline(*args, code: str | None = None, **env) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "manage.py", *args]
    return subprocess.run(command, cwd=ROOT, env=child_env(**env), capture_output=True, text=True, timeout=120)


def assert_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for word in ("pip install -e '.[spark]'", "Java", "libpostgresql-jdbc-java", *words):
        assert word in lines[0], (word, lines[0])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("job", [["report"], ["archive", "--older-than", "30d"]])
def test_without_pyspark(job):
    assert_one_line(pipeline("pipeline", *job, code=NO_PYSPARK), "PySpark")


@pytest.mark.django_db(transaction=True)
def test_without_java(tmp_path):
    result = pipeline("pipeline", "report", PATH=str(tmp_path), JAVA_HOME="")
    assert_one_line(result, "needs Java")


@pytest.mark.django_db(transaction=True)
def test_without_the_jdbc_jar(tmp_path):
    result = pipeline("pipeline", "report", BROKER_JDBC_JAR=str(tmp_path / "missing.jar"))
    assert_one_line(result, "JDBC driver", "missing.jar")
