"""One local SparkSession for the whole Spark suite (JVM start-up is the expensive part)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil

import pytest

logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown chatter hits closed streams


def _missing(why: str):
    """Skip on a workstation without Spark's prerequisites; fail in CI, where they must exist."""
    if os.environ.get("CI"):
        pytest.fail(f"Spark tests cannot run: {why}")
    pytest.skip(reason=why)


@pytest.fixture(scope="session")
def spark():
    if importlib.util.find_spec("pyspark") is None:
        _missing("pyspark is not installed")
    if not shutil.which("java"):
        _missing("java is not installed")
    from django.conf import settings

    if not os.path.exists(settings.BROKER_JDBC_JAR):
        _missing(f"PostgreSQL JDBC driver missing at {settings.BROKER_JDBC_JAR} (apt-get install libpostgresql-jdbc-java)")
    from pipeline.session import spark_session_build

    session = spark_session_build(
        master="local[1]", app_name="broker-tests", driver_memory="1g", shuffle_partitions=1,
        conf={"spark.default.parallelism": "1", "spark.sql.adaptive.coalescePartitions.enabled": "true"},
        reuse=False,
    )
    yield session
    session.stop()


@pytest.fixture
def pipeline_dir(tmp_path, settings):
    """Reports and the latest-report pointer go to a temporary folder."""
    settings.BROKER_PIPELINE_DIR = tmp_path / "pipeline"
    return tmp_path / "pipeline"
