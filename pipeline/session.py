"""The SparkSession and the JDBC connection options, both derived from Django settings.

The master URL is the only thing that changes between a laptop (``local[*]``) and a cluster
(``spark://host:7077``, ``yarn``, ``k8s://...``). The PostgreSQL JDBC driver is Debian's
``libpostgresql-jdbc-java`` jar, shipped to the executors through ``spark.jars`` (no Maven).
The JDBC URL comes from the *live* connection settings of the pipeline's read alias
(``pipeline.source``: the replica of ``BROKER_PIPELINE_DATABASE_URL``, else the broker's database),
so under pytest it points at the test database and with the embedded server at its current port.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from broker.db.urls import DatabaseUrlError, jdbc_url
from pipeline.source import read_alias

JDBC_DRIVER = "org.postgresql.Driver"
# Attempts per Spark task. A cluster retries a failed task (spark.task.maxFailures, 4), a local
# master by default never does: ``local[N]`` becomes ``local[N,4]``, so a chunk that a replica
# cancelled (a conflict with recovery, pipeline.source) is read again instead of failing the run.
TASK_ATTEMPTS = 4
_LOCAL = re.compile(r"local(?:\[(\d+|\*)\])?")


def master_with_retries(master: str) -> str:
    """``master`` with task retries for a plain local master (``local``, ``local[N]``, ``local[*]``);
    any other master (one that says its failures, a cluster) unchanged."""
    match = _LOCAL.fullmatch(master.strip())
    if not match:
        return master
    return f"local[{match.group(1) or 1},{TASK_ATTEMPTS}]"


def spark_session_build(*, master: str | None = None, app_name: str = "broker-pipeline",
                        driver_memory: str | None = None, shuffle_partitions: int | None = None,
                        conf: dict | None = None, reuse: bool = True):
    """The SparkSession for pipeline jobs. With ``reuse`` an already running session (a test
    fixture's, a notebook's) is returned untouched: static settings such as driver memory only
    apply to the first session of a process anyway."""
    from pyspark.sql import SparkSession

    if reuse:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
    jar = settings.BROKER_JDBC_JAR
    if not os.path.exists(jar):
        raise ImproperlyConfigured(
            f"PostgreSQL JDBC driver not found at {jar} (apt-get install libpostgresql-jdbc-java, "
            "or set BROKER_JDBC_JAR)"
        )
    master = master_with_retries(master or settings.SPARK_MASTER)
    # Executors run Python only for Python UDFs (none here); use this interpreter locally.
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Local mode: the driver JVM does all the work in one short run on few cores, where the C2
    # compiler's threads cost more CPU than their faster code saves. C1 only, measured on the
    # report over 1M jobs (2 cores): JVM CPU 51.4 -> 36.1 s, Spark start-up 10.8 -> 6.2 CPU s.
    # A cluster's executors keep the default tiered JIT.
    driver_java = "-Duser.timezone=UTC" + (" -XX:TieredStopAtLevel=1" if master.startswith("local") else "")
    options = {
        "spark.jars": jar,
        "spark.driver.memory": driver_memory or settings.BROKER_SPARK_DRIVER_MEMORY,
        "spark.sql.shuffle.partitions": str(shuffle_partitions or 4),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": driver_java,
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        # Readable by pyarrow/pandas/DuckDB without INT96 surprises.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # No _SUCCESS files among the archive's data files.
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    }
    options.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def jdbc_options_build(*, alias: str | None = None, planner: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """url/user/password/driver for Spark's JDBC source, from the connection Django uses for
    ``alias`` (default: the pipeline's reads, ``pipeline.source.read_alias``): every host of its URL in order (``jdbc:postgresql://h1:p1,h2:p2/db?targetServerType=primary`` for
    ``target_session_attrs=read-write``), its connect timeout, keepalives and sslmode
    (``broker.db.urls.jdbc_url``). ``planner``: settings for the session (a query's registry
    ``settings:`` line), as startup options."""
    conn = connections[alias or read_alias()]
    sd = conn.settings_dict
    if conn.vendor != "postgresql":
        raise ImproperlyConfigured("the Spark pipeline reads PostgreSQL only")
    # prepareThreshold=-1: binary transfer from the first execution (the driver's default is text
    # until a statement has run 5 times, and every Spark read runs once). Decoding text timestamps
    # dominated the report's read: at 1M jobs binary took the JVM CPU from 7.3 to 3.7 s and the
    # read from 19.9 to 8.1 s (PostgreSQL formats no timestamps either).
    params = {"ApplicationName": "broker-pipeline", "prepareThreshold": "-1"}
    opts = sd.get("OPTIONS") or {}
    # the session options of every broker connection (jit = off: broker.settings), then the query's
    startup = [o for o in (opts.get("options"), *(f"-c {name}={value}" for name, value in planner)) if o]
    if startup:
        params["options"] = " ".join(startup)
    try:
        url = jdbc_url(sd, params=params)
    except DatabaseUrlError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    options = {"url": url, "driver": JDBC_DRIVER, "user": sd.get("USER") or "postgres"}
    if sd.get("PASSWORD"):
        options["password"] = sd["PASSWORD"]
    return options
