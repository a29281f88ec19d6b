"""Partitioned JDBC readers for the broker tables.

Every reader names its columns (statements in ``pipeline/queries.sql``): tokens, signing secrets
and callback URLs (which may carry credentials) are never selected, so they cannot reach a
DataFrame, a Parquet file or a report. Reads are split on the primary key (``partitionColumn=id``,
bounds from the table's min/max id, ``numPartitions`` from ``BROKER_SPARK_JDBC_PARTITIONS``) and
fetched ``fetchsize`` rows at a time, so big tables stream through several connections instead of
one giant result set. The bounds only set the stride; the filtering happens in PostgreSQL: time
bounds are Spark filters on the read, which Spark pushes down into the ``WHERE`` it sends.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.conf import settings
from django.db import connection

from pipeline.queries import Q
from pipeline.session import jdbc_options_build
from pipeline.timeparse import sql_timestamp

FETCHSIZE = 10_000
MIN_ROWS_PER_PARTITION = 20_000  # below this a table is read through one connection

DELIVERED = 1003  # jobs.models.JobStatus.DELIVERED

SECRET_COLUMNS = frozenset({"token", "signing_secret", "previous_signing_secret", "callback_url"})

# The tables a read can be split on, each with the statement giving its id bounds.
ID_BOUNDS = {
    "broker_message": Q.message_id_bounds,
    "jobs_job": Q.job_id_bounds,
    "jobs_jobtransition": Q.transition_id_bounds,
    "jobs_deliveryattempt": Q.attempt_id_bounds,
    "jobs_partition": Q.partition_id_bounds,
}
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def jdbc_sql_render(sql, params: dict | None = None) -> str:
    """``sql`` (a Query or text) with each ``%(name)s`` replaced by the literal of ``params[name]``.

    Spark's JDBC reader sends text and binds nothing, so the few values that must sit inside a
    statement (a bound under NOT EXISTS, a status code) are rendered here and only here: a
    timezone-aware or naive (UTC) datetime becomes a TIMESTAMPTZ literal, an int its digits.
    Anything else, a missing value or an unused one is an error: no text ever reaches the SQL."""
    params = dict(params or {})
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, datetime)):
            raise TypeError(f"{name}: only datetimes and ints go into JDBC SQL, not {type(value).__name__}")
    used = set()

    def literal(match: re.Match) -> str:
        name = match.group(1)
        if name not in params:
            raise KeyError(f"no value for %({name})s")
        used.add(name)
        value = params[name]
        return sql_timestamp(value) if isinstance(value, datetime) else str(int(value))

    text = _PLACEHOLDER.sub(literal, str(sql))
    if set(params) - used:
        raise KeyError(f"values without a placeholder: {sorted(set(params) - used)}")
    return text


def table_bounds(*, table: str) -> tuple[int | None, int | None]:
    """min and max id of ``table`` (an index lookup each on the primary key)."""
    with connection.cursor() as cur:
        cur.execute(ID_BOUNDS[table].sql)
        low, high = cur.fetchone()
    return low, high


def window_bounds(*, ranges: list[tuple[datetime, datetime]]) -> tuple[int | None, int | None]:
    """min and max id of the messages received in any of ``ranges`` (message_received ranges)."""
    low = high = None
    with connection.cursor() as cur:
        for since, until in ranges:
            cur.execute(Q.window_message_bounds.sql, {"since": since, "until": until})
            a, b = cur.fetchone()
            if a is not None:
                low, high = (a if low is None else min(low, a)), (b if high is None else max(high, b))
    return low, high


def jdbc_read(*, spark, query, params: dict | None = None, bounds_table: str | None = None,
              bounds: tuple[int | None, int | None] | None = None, partition_column: str = "id",
              num_partitions: int | None = None):
    """Read ``query`` (a registry SELECT exposing ``partition_column``; ``params`` rendered by
    ``jdbc_sql_render``) as a DataFrame, split into ranges of ``partition_column`` between
    ``bounds`` (or the id bounds of ``bounds_table``) when they span enough rows (or when
    ``num_partitions`` is given)."""
    reader = spark.read.format("jdbc").options(**jdbc_options_build())
    reader = (reader.option("dbtable", f"({jdbc_sql_render(query, params)}) AS src")
              .option("fetchsize", str(FETCHSIZE)))
    if bounds_table or bounds:
        low, high = bounds if bounds else table_bounds(table=bounds_table)
        wanted = num_partitions or settings.BROKER_SPARK_JDBC_PARTITIONS or 1
        if num_partitions is None and low is not None:
            wanted = min(wanted, max(1, (high - low + 1) // MIN_ROWS_PER_PARTITION))
        if low is not None and wanted > 1 and high > low:
            reader = (reader.option("partitionColumn", partition_column)
                      .option("lowerBound", str(low)).option("upperBound", str(high + 1))
                      .option("numPartitions", str(wanted)))
    return reader.load()


def _window(frame, column: str, since: datetime | None = None, until: datetime | None = None):
    """``frame`` where ``since <= column < until`` (either bound optional), as Spark filters: Spark
    pushes them down into the WHERE it sends PostgreSQL (the JVM and sessions run in UTC)."""
    from pyspark.sql import functions as F  # optional heavy dependency: only when Spark runs

    if since is not None:
        frame = frame.where(F.col(column) >= F.lit(since))
    if until is not None:
        frame = frame.where(F.col(column) < F.lit(until))
    return frame


def channels_read(*, spark):
    return jdbc_read(spark=spark, query=Q.channels_read)


def producers_read(*, spark):
    return jdbc_read(spark=spark, query=Q.producers_read)


def consumers_read(*, spark):
    return jdbc_read(spark=spark, query=Q.consumers_read)


def messages_read(*, spark, since: datetime | None = None, until: datetime | None = None,
                  payload: bool = False, num_partitions: int | None = None):
    """Messages received in [since, until) (payload only when asked: it is the bulk of the table,
    and a dropped column is left out of the SELECT Spark sends)."""
    frame = jdbc_read(spark=spark, query=Q.messages_read, bounds_table="broker_message",
                      num_partitions=num_partitions)
    frame = _window(frame, "received_at", since, until)
    return frame if payload else frame.drop("payload")


def jobs_read(*, spark, since: datetime | None = None, until: datetime | None = None,
              num_partitions: int | None = None):
    """Jobs of the messages received in [since, until), with that ``received_at`` (publish time)."""
    frame = jdbc_read(spark=spark, query=Q.jobs_read, bounds_table="jobs_job", num_partitions=num_partitions)
    return _window(frame, "received_at", since, until)


def job_facts_read(*, spark, since: datetime, until: datetime, num_partitions: int | None = None):
    """Jobs of the messages received in [since, until), one row each, with their channel and
    consumer ids, publish time, first DELIVERED transition and number of delivery attempts
    (per-job history figures come from PostgreSQL; Spark does every aggregate from here on)."""
    frame = jdbc_read(spark=spark, query=Q.job_facts_read, params={"delivered": DELIVERED},
                      bounds_table="jobs_job", num_partitions=num_partitions)
    return _window(frame, "received_at", since, until)


def transitions_read(*, spark, since: datetime | None = None, to_status: int | None = None,
                     num_partitions: int | None = None):
    """Job history rows at or after ``since`` (optionally only moves into ``to_status``)."""
    frame = jdbc_read(spark=spark, query=Q.transitions_read, bounds_table="jobs_jobtransition",
                      num_partitions=num_partitions)
    frame = _window(frame, "at", since)
    return frame if to_status is None else frame.where(frame["to_status"] == int(to_status))


def attempts_read(*, spark, since: datetime | None = None, columns=None, num_partitions: int | None = None):
    """Delivery attempts started at or after ``since`` (only ``columns`` when given)."""
    frame = jdbc_read(spark=spark, query=Q.attempts_read, bounds_table="jobs_deliveryattempt",
                      num_partitions=num_partitions)
    frame = _window(frame, "started_at", since)
    return frame if columns is None else frame.select(*columns)


def _in_ranges(frame, column: str, ranges: list[tuple[datetime, datetime]]):
    """``frame`` where ``column`` falls in any of ``ranges`` (pushed down as one WHERE of ORs)."""
    from pyspark.sql import functions as F

    test = None
    for since, until in ranges:
        one = (F.col(column) >= F.lit(since)) & (F.col(column) < F.lit(until))
        test = one if test is None else test | one
    return frame.where(test if test is not None else F.lit(False))


def live_read(*, spark, table: str, ranges: list[tuple[datetime, datetime]],
              bounds: tuple[int | None, int | None]):
    """The dataset's live rows of ``table`` (jobs, attempts or transitions) for the messages
    received in ``ranges``, split on the message id between ``bounds`` (``window_bounds``)."""
    query, params = {
        "jobs": (Q.job_facts_read, {"delivered": DELIVERED}),
        "attempts": (Q.dataset_attempts_read, None),
        "transitions": (Q.dataset_transitions_read, None),
    }[table]
    frame = jdbc_read(spark=spark, query=query, params=params, bounds=bounds, partition_column="message_id")
    return _in_ranges(frame, "received_at", ranges)
