"""Retention: stored messages go once their jobs are finished and their channel's window has passed.

A message older than its channel's ``retention`` (empty: ``BROKER_RETENTION``, default 7 days)
whose jobs are all finished (DELIVERED, or DEAD for ``BROKER_DEAD_RETENTION``) is removed with
its jobs, their history and their attempts by ``retention_sweep``, a housekeeping step (every
``RETENTION_EVERY`` seconds in each push dispatcher loop, and in the fallback maintenance task), so
it goes within seconds of passing the window. A message with a QUEUED or INFLIGHT job is never
removed (the statement, ``retention_batch``, locks and re-checks; see its comment).

Cost: batched deletes over ``message_channel_received`` (channel, received_at, id), never a scan.
Each channel has a cursor (``jobs.models.RetentionCursor``): its ``tip`` walks forward through
messages as they pass the window, so a batch starts right after what the last one removed, whatever
the table's size; messages held back (a job still running, a DEAD job not old enough, a row someone
held) are left behind the tip and re-examined by a slower pass (``sweep``) that starts at most once
every ``SWEEP_EVERY`` seconds (15) and runs at most ``SWEEP_BATCHES`` batches per call: a message
held back while its last job was still running goes within about 20 s of that job finishing (when
few are held back; a pass over very many held back, a consumer days behind, takes longer but costs
the same per call). A call spends at most ``RETENTION_BUDGET`` seconds (and one batch), each batch
is its own short transaction, and one sweep runs at a time (an advisory lock): traffic is never
stalled behind it.

Not a job status change (the rows leave the database with their whole history), so it goes through
no status writer, writes no history (the deleting statement clears ``broker.history_reason``, so the
jobs_job trigger writes none) and removes the history rows itself. The maintained counters (job and
message counts) follow through their delete triggers; what retention removed is counted per channel
and per consumer (``broker.counters`` RETENTION, RETENTION_CONSUMER) and shown with the oldest stored
message and the last run on the channel and consumer GETs, /metrics and the admin dashboard; and its
jobs per channel and UTC day of publication (RETENTION_DAYS), so a Spark report knows which days
lost rows that no archive holds (``pipeline.dataset``).

The Spark archive (``manage.py pipeline archive``) is the way to keep a copy: run it with windows
shorter than these (``--older-than`` < the retention, ``--dead-older-than`` < BROKER_DEAD_RETENTION).
The dedupe window of ``X-Broker-Message-ID`` is the retention: once a message is removed its id can
be published again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone

from django.conf import settings

from broker.counters import RETENTION, RETENTION_CONSUMER, RETENTION_RUNS, RETENTION_TABLES, counts_for
from broker.db.run import query_fetchall, query_fetchone
from broker.durations import duration_format, duration_parse
from broker.times import rfc3339
from jobs.sweeps.queries import Q

RETENTION_BATCH = 500  # messages examined per statement (with their jobs, history and attempts)
RETENTION_BUDGET = 0.5  # seconds one call may spend on batches (plus the one under way)
RETENTION_EVERY = 5.0  # seconds between two calls in a push dispatcher loop
# seconds between two starts of the pass over the messages held back: a message whose jobs finish
# after it passed the window (a push delivery under way when the sweep first saw it, a consumer that
# was behind) goes within this plus RETENTION_EVERY once they finish, well inside the minute
SWEEP_EVERY = 15.0
SWEEP_BATCHES = 2  # batches of that pass per call: its cost stays bounded however many are held back
RUN_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)  # seconds: the run-duration histogram
RUN_BUCKET, RUN_SUM = 100, 199  # codes of the run counters (scope RETENTION_RUNS; 1: runs)
RUNS = 1
START = (datetime(1, 1, 2, tzinfo=timezone.utc), 0)  # before every message
END = (datetime(9999, 12, 30, tzinfo=timezone.utc), 2**63 - 1)  # after every message


@dataclass
class Removed:
    """Rows removed, by table."""

    messages: int = 0
    jobs: int = 0
    transitions: int = 0
    attempts: int = 0

    @property
    def rows(self) -> int:
        return self.messages + self.jobs + self.transitions + self.attempts

    def add(self, other: Removed) -> None:
        """Field by field (a subclass's counters and lists too: pipeline.prune.PruneCounts)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Channel:
    """One channel's cursor while a call runs (``jobs.models.RetentionCursor``)."""

    pk: int
    seconds: float  # the retention in force
    tip: tuple | None  # (received_at, id) examined up to; None: never
    sweep: tuple | None  # the pass over held-back messages: where it stands; None: none under way
    sweep_started_at: datetime | None
    due: bool  # a message past the window after the tip
    changed: bool = False


@dataclass
class RetentionRunResult:
    removed: Removed = field(default_factory=Removed)
    batches: int = 0
    seconds: float = 0.0
    ran: bool = False  # False: another process was sweeping


def seconds_of(value) -> int:
    """A retention setting (timedelta from the settings, or a duration a test or caller gives)."""
    return duration_parse(value)


def retention_sweep(*, limit: int = RETENTION_BATCH, budget: float = RETENTION_BUDGET) -> int:
    """The housekeeping step: remove what retention allows, in batches of ``limit`` messages for at
    most ``budget`` seconds (plus the batch under way); one call at a time per database (the others
    return 0 at once). Call it outside a transaction: each batch commits on its own. Returns the
    rows removed (messages, jobs, history rows and attempts)."""
    return retention_run(limit=limit, budget=budget).removed.rows


def retention_run(*, limit: int = RETENTION_BATCH, budget: float = RETENTION_BUDGET,
                  sweep_every: float = SWEEP_EVERY) -> RetentionRunResult:
    """``retention_sweep`` with the whole result (what was removed, batches, duration);
    ``sweep_every``: seconds between two passes over the messages held back."""
    if not query_fetchone(Q.retention_lock)[0]:
        return RetentionRunResult()
    try:
        result = _run(limit=int(limit), budget=budget, sweep_every=sweep_every)
        _run_record(result)
        return result
    finally:
        query_fetchone(Q.retention_unlock)


def _run(*, limit: int, budget: float, sweep_every: float) -> RetentionRunResult:
    started = time.monotonic()
    stop_at = started + budget
    result = RetentionRunResult(ran=True)
    dead_seconds = seconds_of(settings.BROKER_DEAD_RETENTION)
    rows = query_fetchall(Q.retention_channels, {"retention": seconds_of(settings.BROKER_RETENTION)})
    now = rows[0][8] if rows else None
    channels = [_Channel(pk=pk, seconds=secs, tip=(tip_at, tip_id) if tip_at is not None else None,
                         sweep=(sweep_at, sweep_id) if sweep_at is not None else None,
                         sweep_started_at=started_at, due=bool(due))
                for pk, secs, tip_at, tip_id, sweep_at, sweep_id, started_at, due, _ in rows]

    def batch(channel: _Channel, after: tuple, until: tuple) -> tuple[int, tuple | None]:
        examined, last_at, last_id, *counts = _batch(channel=channel, after=after, until=until, limit=limit,
                                                     dead_seconds=dead_seconds)
        result.removed.add(Removed(*counts))
        result.batches += 1
        return examined, (last_at, last_id) if examined else None

    # the tips: messages that passed the window since, one batch per channel per round (fair)
    pending = [c for c in channels if c.due]
    while pending and time.monotonic() < stop_at:
        for channel in list(pending):
            examined, last = batch(channel, channel.tip or START, END)
            if last is not None:
                channel.tip, channel.changed = last, True
            if examined < limit:
                pending.remove(channel)
            if time.monotonic() >= stop_at:
                break
    # the pass over what was held back behind the tips: a few batches per call
    left = SWEEP_BATCHES
    for channel in channels:
        if left <= 0 or time.monotonic() >= stop_at:
            break
        if channel.tip is None:
            continue
        if channel.sweep is None:
            if channel.sweep_started_at is not None and (now - channel.sweep_started_at).total_seconds() < sweep_every:
                continue
            channel.sweep, channel.sweep_started_at, channel.changed = START, now, True
        while left > 0 and time.monotonic() < stop_at:
            left -= 1
            examined, last = batch(channel, channel.sweep, channel.tip)
            channel.changed = True
            if examined < limit:
                channel.sweep = None  # the pass reached the tip
                break
            channel.sweep = last
    for channel in channels:
        if channel.changed:
            _cursor_save(channel)
    result.seconds = time.monotonic() - started
    return result


def _batch(*, channel: _Channel, after: tuple, until: tuple, limit: int, dead_seconds: int) -> tuple:
    """One retention_batch statement (its own transaction outside one): (examined, last received_at,
    last id, messages, jobs, transitions, attempts removed)."""
    row = query_fetchone(Q.retention_batch, {
        "channel": channel.pk, "after_at": after[0], "after_id": after[1], "until_at": until[0],
        "until_id": until[1], "retention": float(channel.seconds), "dead_retention": float(dead_seconds),
        "limit": limit})
    return row[:7]


def _cursor_save(channel: _Channel) -> None:
    tip = channel.tip or (None, 0)
    sweep = channel.sweep or (None, None)
    query_fetchone(Q.retention_cursor_save, {
        "channel": channel.pk, "tip_at": tip[0], "tip_id": tip[1], "sweep_at": sweep[0], "sweep_id": sweep[1],
        "sweep_started_at": channel.sweep_started_at})


def run_bucket(seconds: float) -> int:
    """The run-duration histogram code of a run that took ``seconds``."""
    for i, bound in enumerate(RUN_BOUNDS):
        if seconds <= bound:
            return RUN_BUCKET + i
    return RUN_BUCKET + len(RUN_BOUNDS)


def _run_record(result: RetentionRunResult) -> None:
    query_fetchone(Q.retention_run_record, {
        "seconds": result.seconds, "removed": result.removed.rows, "batches": result.batches,
        "bucket": run_bucket(result.seconds), "micros": round(result.seconds * 1e6)})


# --- the footprint: what the GETs, /metrics and the dashboard show ----------------------------------

@dataclass(frozen=True)
class LastRun:
    started_at: datetime
    seconds: float
    removed: int


def retention_last_run() -> LastRun | None:
    """The sweep's last run (None: it never ran)."""
    row = query_fetchone(Q.retention_last_run)
    return None if row is None else LastRun(started_at=row[0], seconds=float(row[1]), removed=int(row[2]))


def retention_seconds(channel) -> int:
    """The retention in force for ``channel``: its own, else BROKER_RETENTION."""
    return channel.retention if channel.retention is not None else seconds_of(settings.BROKER_RETENTION)


@dataclass(frozen=True)
class Oldest:
    """A stored message's time of arrival and its age (seconds, database clock)."""

    at: datetime | None = None
    age: float | None = None


def oldest_messages(*, channel_pks: list[int]) -> dict[int, Oldest]:
    """{channel pk: its oldest stored message} (``Oldest()`` without any)."""
    if not channel_pks:
        return {}
    return {pk: Oldest(at, age) for pk, at, age in query_fetchall(Q.oldest_messages, {"ids": list(channel_pks)})}


def oldest_consumer_messages(*, consumer_pks: list[int]) -> dict[int, Oldest]:
    """{consumer pk: the message of its oldest stored job} (``Oldest()`` without any)."""
    if not consumer_pks:
        return {}
    rows = query_fetchall(Q.oldest_consumer_messages, {"ids": list(consumer_pks)})
    return {pk: Oldest(at, age) for pk, at, age in rows}


def removed_by_channel(channel_pks: list[int] | None = None) -> dict[int, dict[str, int]]:
    """{channel pk: {"messages", "jobs", "transitions", "attempts": rows removed by retention}}."""
    counts = counts_for(scope=RETENTION, owner_ids=channel_pks)
    return {pk: {name: by_code.get(code, 0) for code, name in RETENTION_TABLES.items()}
            for pk, by_code in counts.items()}


def run_counts() -> dict[int, int]:
    """The run counters (RUNS, the duration buckets, RUN_SUM in microseconds)."""
    return counts_for(scope=RETENTION_RUNS, owner_ids=[0]).get(0, {})


def _last_run_fields(last: LastRun | None) -> dict:
    return {"RetentionLastRunAt": rfc3339(last.started_at) if last else None,
            "RetentionLastRunSeconds": round(last.seconds, 4) if last else None}


def _oldest_fields(oldest: Oldest | None) -> dict:
    oldest = oldest or Oldest()
    return {"OldestMessageAt": rfc3339(oldest.at),
            "OldestMessageAgeSeconds": None if oldest.age is None else round(max(oldest.age, 0.0), 3)}


def channel_footprint(*, channel) -> dict:
    """The channel GET's ``Footprint``: the retention in force, its oldest stored message, the rows
    retention removed from it, and the sweep's last run."""
    removed = removed_by_channel([channel.pk]).get(channel.pk, {})
    return {
        "Retention": duration_format(retention_seconds(channel)),
        **_oldest_fields(oldest_messages(channel_pks=[channel.pk]).get(channel.pk)),
        "RemovedByRetention": {name.capitalize(): removed.get(name, 0) for name in RETENTION_TABLES.values()},
        **_last_run_fields(retention_last_run()),
    }


def consumer_footprint(*, consumer_pk: int) -> dict:
    """The consumer GET's ``Footprint``: its channel's retention in force, the message of its oldest
    stored job, the rows of its own that retention removed (jobs, their history and attempts), the
    sweep's last run."""
    row = query_fetchone(Q.consumer_retention, {"consumer": consumer_pk,
                                                "retention": seconds_of(settings.BROKER_RETENTION)})
    counts = counts_for(scope=RETENTION_CONSUMER, owner_ids=[consumer_pk]).get(consumer_pk, {})
    return {
        "Retention": duration_format(row[0]) if row else None,
        **_oldest_fields(oldest_consumer_messages(consumer_pks=[consumer_pk]).get(consumer_pk)),
        "RemovedByRetention": {name.capitalize(): counts.get(code, 0)
                               for code, name in RETENTION_TABLES.items() if name != "messages"},
        **_last_run_fields(retention_last_run()),
    }
