"""What Spark needs on this machine (pyspark, Java, the JDBC jar): skip where it is missing on a
workstation, fail in CI (where it must exist). Shared by the Spark suite and the bench smoke test."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def spark_prerequisite_missing() -> str | None:
    """Why Spark cannot run here, or None when it can."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    if not shutil.which("java"):
        return "java is not installed"
    from django.conf import settings

    if not os.path.exists(settings.BROKER_JDBC_JAR):
        return f"PostgreSQL JDBC driver missing at {settings.BROKER_JDBC_JAR} (apt-get install libpostgresql-jdbc-java)"
    return None


def spark_prerequisites_require() -> None:
    """Skip on a workstation without Spark's prerequisites; fail in CI, where they must exist."""
    why = spark_prerequisite_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"Spark tests cannot run: {why}")
    pytest.skip(reason=why)
