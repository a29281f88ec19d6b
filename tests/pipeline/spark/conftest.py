"""One local SparkSession for the whole Spark suite (JVM start-up is the expensive part)."""

from __future__ import annotations

import logging

import pytest

from tests.pipeline.spark.cluster import StandaloneCluster
from tests.pipeline.spark.prerequisites import spark_prerequisites_require

CLUSTER = pytest.StashKey[StandaloneCluster]()

logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown chatter hits closed streams


@pytest.fixture(scope="session")
def spark(request, tmp_path_factory):
    spark_prerequisites_require()
    from pipeline.session import spark_session_build

    if any(item.path.name == "test_cluster.py" for item in request.session.items):
        # its master and worker JVMs start now, while the other Spark tests run
        request.config.stash[CLUSTER] = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
        request.addfinalizer(request.config.stash[CLUSTER].stop)

    session = spark_session_build(
        master="local[1]", app_name="broker-tests", driver_memory="1g", shuffle_partitions=1,
        conf={"spark.default.parallelism": "1", "spark.sql.adaptive.coalescePartitions.enabled": "true"},
        reuse=False,
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def small_chunks(settings):
    """Every read cut into many chunks (each its own JDBC query and transaction), so each figure
    the Spark tests check also checks that the chunks' edges lose and repeat nothing."""
    settings.BROKER_PIPELINE_CHUNK_ROWS = 40


@pytest.fixture(autouse=True)
def pipeline_dir(tmp_path, settings):
    """Reports, facts, the default archive and the latest-report pointer go to a temporary folder
    (never the facts of another database under .data)."""
    settings.BROKER_PIPELINE_DIR = tmp_path / "pipeline"
    return tmp_path / "pipeline"


@pytest.fixture
def standalone_cluster(request, spark) -> str:
    """``spark://127.0.0.1:<port>`` of the session's standalone cluster (master and one worker)."""
    return request.config.stash[CLUSTER].ready()
