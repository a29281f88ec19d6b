"""Chunked JDBC readers for the broker tables.

Every reader names its columns (statements in ``pipeline/queries.sql``): tokens, signing secrets
and callback URLs (which may carry credentials) are never selected, so they cannot reach a
DataFrame, a Parquet file or a report. The time bounds are Spark filters on the read, which Spark
pushes down into the ``WHERE`` it sends PostgreSQL.

No read holds a snapshot for long (issue 35: a snapshot held for minutes stops vacuum on every
table and costs each message of the broker). A read is cut into chunks of about
``BROKER_PIPELINE_CHUNK_ROWS`` rows on an indexed, immutable key (the primary key, or the message
id of the dataset's reads: ids are handed out in publication order, so a chunk is a short index
range scan of a narrow stretch of time), and each chunk is one query in its own transaction: Spark
runs a partition's query on a connection of its own and commits and closes it once its rows are
fetched. The chunks are ``key >= a AND key < b`` from the read's lowest key, the last one open
above (``chunk_predicates``; one Spark partition each), so every row falls in exactly one chunk
however its other columns change meanwhile: nothing is read twice or missed at a chunk's edge, and
a row committed after its chunk was read is simply later than this read (the next run has it; a
day is finished, and its facts written, only long after its last publish committed). The chunks
are coalesced into ``BROKER_SPARK_JDBC_PARTITIONS`` tasks, each reading its chunks one after the
other: that many connections at a time, whatever the table's size.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from django.conf import settings

from pipeline.queries import Q
from pipeline.session import jdbc_options_build
from pipeline.source import read_connection, replica_retry
from pipeline.timeparse import sql_timestamp

FETCHSIZE = 10_000

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
# The dataset's tables, read by message id: the table whose rows each read returns.
LIVE_TABLES = {"jobs": "jobs_job", "attempts": "jobs_deliveryattempt", "transitions": "jobs_jobtransition"}
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


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


def chunk_count(*, low: int | None, high: int | None, rows_per_key: float = 1.0,
                chunk_rows: int | None = None) -> int:
    """How many chunks a read of keys ``low..high`` is cut into: about ``chunk_rows`` rows each
    (``BROKER_PIPELINE_CHUNK_ROWS``), ``rows_per_key`` rows per key value (1 for a primary key;
    for a read by message id, the table's rows per message)."""
    if low is None or high is None or high <= low:
        return 1
    size = max(1, chunk_rows if chunk_rows is not None else settings.BROKER_PIPELINE_CHUNK_ROWS)
    keys = high - low + 1
    return max(1, min(keys, math.ceil(keys * max(rows_per_key, 0.0) / size)))


def chunk_predicates(*, column: str, low: int, high: int, chunks: int) -> list[str]:
    """The ``WHERE`` of each of ``chunks`` chunks of ``column`` from ``low`` (the read's lowest key)
    up, the last open above (rows committed since the bounds were taken): equal key ranges,
    disjoint, together covering every key from ``low``. No chunk is open below: from the middle of
    a table (today's messages), that chunk would scan every older row of the index."""
    if not _IDENTIFIER.fullmatch(column):
        raise ValueError(f"not a column name: {column!r}")
    low, high, chunks = int(low), int(high), max(1, int(chunks))
    edges = [low + (i * (high + 1 - low)) // chunks for i in range(chunks)]
    return [f"{column} >= {a} AND {column} < {b}" for a, b in zip(edges, edges[1:])] + [f"{column} >= {edges[-1]}"]


@replica_retry
def table_bounds(*, table: str) -> tuple[int | None, int | None]:
    """min and max id of ``table`` (an index lookup each on the primary key)."""
    with read_connection().cursor() as cur:
        cur.execute(ID_BOUNDS[table].sql)
        low, high = cur.fetchone()
    return low, high


@replica_retry
def window_bounds(*, ranges: list[tuple[datetime, datetime]]) -> tuple[int | None, int | None]:
    """min and max id of the messages received in any of ``ranges`` (message_received ranges)."""
    low = high = None
    with read_connection().cursor() as cur:
        for since, until in ranges:
            cur.execute(Q.window_message_bounds.sql, {"since": since, "until": until})
            a, b = cur.fetchone()
            if a is not None:
                low, high = (a if low is None else min(low, a)), (b if high is None else max(high, b))
    return low, high


def rows_per_message() -> dict[str, float]:
    """The dataset tables' rows per message id (``LIVE_TABLES``' keys), from the tables' id spans
    (the ids follow insertion, deletions thin every table alike): what sizes the chunks of a read
    split on the message id. Taken once, before any read starts."""
    low, high = table_bounds(table="broker_message")
    result = {}
    for name, table in LIVE_TABLES.items():
        a, b = table_bounds(table=table)
        result[name] = 1.0 if low is None or a is None else (b - a + 1) / (high - low + 1)
    return result


def jdbc_read(*, spark, query, params: dict | None = None, bounds_table: str | None = None,
              bounds: tuple[int | None, int | None] | None = None, partition_column: str = "id",
              rows_per_key: float = 1.0, num_partitions: int | None = None, chunk_rows: int | None = None):
    """Read ``query`` (a registry SELECT exposing ``partition_column``; ``params`` rendered by
    ``jdbc_sql_render``) as a DataFrame: in chunks of ``partition_column`` between ``bounds`` (or
    the id bounds of ``bounds_table``), each its own short query and transaction (``chunk_count``),
    run by ``num_partitions`` (``BROKER_SPARK_JDBC_PARTITIONS``) tasks at most."""
    options = jdbc_options_build(planner=getattr(query, "settings", ()))
    url, table = options.pop("url"), f"({jdbc_sql_render(query, params)}) AS src"
    properties = {**options, "fetchsize": str(FETCHSIZE)}
    chunks = 1
    if bounds_table or bounds:
        low, high = bounds if bounds else table_bounds(table=bounds_table)
        chunks = chunk_count(low=low, high=high, rows_per_key=rows_per_key, chunk_rows=chunk_rows)
    if chunks > 1:
        predicates = chunk_predicates(column=partition_column, low=low, high=high, chunks=chunks)
        frame = spark.read.jdbc(url, table, predicates=predicates, properties=properties)
    else:
        frame = spark.read.jdbc(url, table, properties=properties)
    tasks = max(1, num_partitions or settings.BROKER_SPARK_JDBC_PARTITIONS or 1)
    return frame.coalesce(tasks) if chunks > tasks else frame


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
              bounds: tuple[int | None, int | None], rows_per_key: float = 1.0):
    """The dataset's live rows of ``table`` (jobs, attempts or transitions) for the messages
    received in ``ranges``, in chunks of the message id between ``bounds`` (``window_bounds``;
    ``rows_per_key``: the table's rows per message, ``rows_per_message``)."""
    query, params = {
        "jobs": (Q.job_facts_read, {"delivered": DELIVERED}),
        "attempts": (Q.dataset_attempts_read, None),
        "transitions": (Q.dataset_transitions_read, None),
    }[table]
    frame = jdbc_read(spark=spark, query=query, params=params, bounds=bounds, partition_column="message_id",
                      rows_per_key=rows_per_key)
    return _in_ranges(frame, "received_at", ranges)
