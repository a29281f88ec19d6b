"""One local SparkSession for the whole Spark suite (JVM start-up is the expensive part)."""

from __future__ import annotations

import logging

import pytest

from tests.pipeline.spark.prerequisites import spark_prerequisites_require

logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown chatter hits closed streams


@pytest.fixture(scope="session")
def spark():
    spark_prerequisites_require()
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
