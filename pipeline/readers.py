"""Partitioned JDBC readers for the broker tables.

Every reader names its columns: tokens, signing secrets and callback URLs (which may carry
credentials) are never selected, so they cannot reach a DataFrame, a Parquet file or a report.
Reads are split on the primary key (``partitionColumn=id``, bounds from the table's min/max id,
``numPartitions`` from ``BROKER_SPARK_JDBC_PARTITIONS``) and fetched ``fetchsize`` rows at a time,
so big tables stream through several connections instead of one giant result set. The bounds
only set the stride; the ``WHERE`` of the subquery does the filtering (in PostgreSQL).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection

from pipeline.session import jdbc_options_build
from pipeline.timeparse import sql_timestamp

FETCHSIZE = 10_000
MIN_ROWS_PER_PARTITION = 20_000  # below this a table is read through one connection

CHANNEL_COLUMNS = ("id", "channel_id", "name", "created_at", "updated_at")
PRODUCER_COLUMNS = ("id", "producer_id", "name", "created_at", "updated_at")
CONSUMER_COLUMNS = (
    "id", "channel_id", "consumer_id", "name", "type", "max_in_flight", "max_deliveries_per_second",
    "connection_timeout", "max_retry", "retry_backoff", "created_at", "updated_at",
)
JOB_COLUMNS = (
    "id", "message_id", "consumer_id", "channel_id", "status", "priority", "retry_count",
    "next_attempt_at", "deadline", "incremental_timeout", "status_changed_at", "created_at",
)
TRANSITION_COLUMNS = ("id", "job_id", "from_status", "to_status", "retry_count", "reason", "at")
ATTEMPT_COLUMNS = (
    "id", "job_id", "attempt", "started_at", "duration_ms", "status_code", "response_excerpt",
    "error", "request_id", "outcome",
)
DELIVERED = 1003  # jobs.models.JobStatus.DELIVERED

SECRET_COLUMNS = frozenset({"token", "signing_secret", "previous_signing_secret", "callback_url"})

# Message headers are kept, minus any that look like credentials.
SENSITIVE_HEADER = r"(token|secret|authorization|signature|password|passwd|api[-_]?key|cookie)"


def headers_sql(alias: str = "m") -> str:
    """The message's headers as JSON text, without credential-looking keys."""
    return (
        f"(CASE WHEN jsonb_typeof({alias}.headers) = 'object' THEN "
        f"(SELECT COALESCE(jsonb_object_agg(h.k, h.v), '{{}}'::jsonb) FROM jsonb_each({alias}.headers) AS h(k, v) "
        f"WHERE h.k !~* '{SENSITIVE_HEADER}') ELSE {alias}.headers END)::text"
    )


def day_sql(column: str) -> str:
    """The UTC day of a timestamptz as 'YYYY-MM-DD' (a partition value independent of time zones)."""
    return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


def table_bounds(*, table: str, column: str = "id") -> tuple[int | None, int | None]:
    """min and max of the partition column (an index lookup each on the primary key)."""
    with connection.cursor() as cur:
        cur.execute(f'SELECT min("{column}"), max("{column}") FROM "{table}"')
        low, high = cur.fetchone()
    return low, high


def jdbc_read(*, spark, sql: str, bounds_table: str | None = None, partition_column: str = "id",
              num_partitions: int | None = None):
    """Read ``sql`` (a SELECT exposing ``partition_column``) as a DataFrame, split into id ranges
    of ``bounds_table`` when it is big enough (or when ``num_partitions`` is given)."""
    reader = spark.read.format("jdbc").options(**jdbc_options_build())
    reader = reader.option("dbtable", f"({sql}) AS src").option("fetchsize", str(FETCHSIZE))
    if bounds_table:
        low, high = table_bounds(table=bounds_table)
        wanted = num_partitions or settings.BROKER_SPARK_JDBC_PARTITIONS or 1
        if num_partitions is None and low is not None:
            wanted = min(wanted, max(1, (high - low + 1) // MIN_ROWS_PER_PARTITION))
        if low is not None and wanted > 1 and high > low:
            reader = (reader.option("partitionColumn", partition_column)
                      .option("lowerBound", str(low)).option("upperBound", str(high + 1))
                      .option("numPartitions", str(wanted)))
    return reader.load()


def _cols(alias: str, columns) -> str:
    return ", ".join(f"{alias}.{c}" for c in columns)


def _and(conditions: list[str]) -> str:
    conditions = [c for c in conditions if c]
    return (" WHERE " + " AND ".join(f"({c})" for c in conditions)) if conditions else ""


def channels_read(*, spark):
    return jdbc_read(spark=spark, sql=f"SELECT {_cols('c', CHANNEL_COLUMNS)} FROM broker_channel c")


def producers_read(*, spark):
    return jdbc_read(spark=spark, sql=f"SELECT {_cols('p', PRODUCER_COLUMNS)} FROM broker_producer p")


def consumers_read(*, spark):
    return jdbc_read(spark=spark, sql=f"SELECT {_cols('c', CONSUMER_COLUMNS)} FROM consumers_consumer c")


def messages_read(*, spark, since: datetime | None = None, until: datetime | None = None,
                  payload: bool = False, where: str = "", num_partitions: int | None = None):
    """Messages received in [since, until) (payload only when asked: it is the bulk of the table)."""
    cols = [
        "m.id", "m.channel_id", "m.message_id", "m.producer_id", "m.content_type", "m.priority",
        f"{headers_sql('m')} AS headers", "m.status", "m.received_at", "m.dispatched_at",
    ]
    if payload:
        cols.insert(4, "m.payload")
    sql = f"SELECT {', '.join(cols)} FROM broker_message m" + _and([
        since and f"m.received_at >= {sql_timestamp(since)}",
        until and f"m.received_at < {sql_timestamp(until)}",
        where,
    ])
    return jdbc_read(spark=spark, sql=sql, bounds_table="broker_message", num_partitions=num_partitions)


def jobs_read(*, spark, since: datetime | None = None, until: datetime | None = None, where: str = "",
              num_partitions: int | None = None):
    """Jobs of the messages received in [since, until), with that ``received_at`` (publish time)."""
    sql = (f"SELECT {_cols('j', JOB_COLUMNS)}, m.received_at FROM jobs_job j "
           "JOIN broker_message m ON m.id = j.message_id") + _and([
        since and f"m.received_at >= {sql_timestamp(since)}",
        until and f"m.received_at < {sql_timestamp(until)}",
        where,
    ])
    return jdbc_read(spark=spark, sql=sql, bounds_table="jobs_job", num_partitions=num_partitions)


def job_facts_read(*, spark, since: datetime, until: datetime, num_partitions: int | None = None):
    """Jobs of the messages received in [since, until), one row each, with their channel and
    consumer ids, publish time, first DELIVERED transition and number of delivery attempts.

    The two per-job history figures are index lookups in PostgreSQL (``job_id`` is indexed on
    both history tables): measured at 1M jobs this reads ~3x faster than shipping the ~3M
    history rows over JDBC and joining them in Spark. Spark does every aggregate from here on."""
    sql = (
        "SELECT j.id, j.message_id, j.channel_id, COALESCE(c.channel_id, '#' || j.channel_id) AS channel, "
        "j.consumer_id, COALESCE(co.consumer_id, '#' || j.consumer_id) AS consumer, j.status, j.retry_count, "
        "j.status_changed_at, j.created_at, m.received_at, "
        f"CASE WHEN j.status = {DELIVERED} THEN (SELECT min(t.at) FROM jobs_jobtransition t "
        f"WHERE t.job_id = j.id AND t.to_status = {DELIVERED}) END AS delivered_transition_at, "
        "(SELECT count(*) FROM jobs_deliveryattempt a WHERE a.job_id = j.id) AS attempts "
        "FROM jobs_job j JOIN broker_message m ON m.id = j.message_id "
        "LEFT JOIN broker_channel c ON c.id = j.channel_id "
        "LEFT JOIN consumers_consumer co ON co.id = j.consumer_id "
        f"WHERE m.received_at >= {sql_timestamp(since)} AND m.received_at < {sql_timestamp(until)}"
    )
    return jdbc_read(spark=spark, sql=sql, bounds_table="jobs_job", num_partitions=num_partitions)


def failed_attempts_read(*, spark, since: datetime, until: datetime, num_partitions: int | None = None):
    """Failed delivery attempts (an error, or a non-2xx status code) of the jobs of the messages
    received in [since, until), with their job's channel and consumer ids and ``error_reason``
    (the error's first line, trimmed, at most 200 characters)."""
    sql = (
        "SELECT a.id, a.job_id, a.status_code, "
        "left(btrim(split_part(btrim(a.error, E' \\t\\r\\n'), E'\\n', 1)), 200) AS error_reason, "
        "COALESCE(c.channel_id, '#' || j.channel_id) AS channel, "
        "COALESCE(co.consumer_id, '#' || j.consumer_id) AS consumer "
        "FROM jobs_deliveryattempt a JOIN jobs_job j ON j.id = a.job_id "
        "JOIN broker_message m ON m.id = j.message_id "
        "LEFT JOIN broker_channel c ON c.id = j.channel_id "
        "LEFT JOIN consumers_consumer co ON co.id = j.consumer_id "
        f"WHERE m.received_at >= {sql_timestamp(since)} AND m.received_at < {sql_timestamp(until)} "
        "AND (a.error <> '' OR a.status_code < 200 OR a.status_code >= 300)"
    )
    return jdbc_read(spark=spark, sql=sql, bounds_table="jobs_deliveryattempt", num_partitions=num_partitions)


def transitions_read(*, spark, since: datetime | None = None, to_status: int | None = None,
                     where: str = "", num_partitions: int | None = None):
    """Job history rows at or after ``since`` (optionally only moves into ``to_status``)."""
    sql = f"SELECT {_cols('t', TRANSITION_COLUMNS)} FROM jobs_jobtransition t" + _and([
        since and f"t.at >= {sql_timestamp(since)}",
        to_status is not None and f"t.to_status = {int(to_status)}",
        where,
    ])
    return jdbc_read(spark=spark, sql=sql, bounds_table="jobs_jobtransition", num_partitions=num_partitions)


def attempts_read(*, spark, since: datetime | None = None, where: str = "", columns=ATTEMPT_COLUMNS,
                  num_partitions: int | None = None):
    """Delivery attempts started at or after ``since``."""
    cols = _cols("a", columns)
    sql = f"SELECT {cols} FROM jobs_deliveryattempt a" + _and([
        since and f"a.started_at >= {sql_timestamp(since)}",
        where,
    ])
    return jdbc_read(spark=spark, sql=sql, bounds_table="jobs_deliveryattempt", num_partitions=num_partitions)
