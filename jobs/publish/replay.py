"""Replay: deliver a window of a channel's stored messages to one consumer again (after an outage).

``consumer_replay`` is the one service behind ``POST /channel/{c}/consumer/{k}/replay``, the admin
page's "Replay" form and ``manage.py replay``. It walks the channel's messages received in
[since, until] in chunks of ``CHUNK``, one statement and one short transaction each
(``jobs_replay_chunk``, the replay's status writer: DELIVERED / DEAD -> QUEUED, kind ``replay``,
and fresh QUEUED jobs for messages without one), so a replay of a million messages never holds long
locks and publishing goes on beside it. Every replay is recorded as an advisory (``replay``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from broker.db.run import query_fetchone
from broker.errors import InvalidInput
from broker.times import db_now, rfc3339
from consumers.models import Consumer
from jobs.advisories.record import advisory_record
from jobs.publish.queries import Q
from jobs.state.transitions import DEAD, DELIVERED, QUEUED, transitions_check

REPLAY_MOVES = ((DELIVERED, QUEUED), (DEAD, QUEUED))


@dataclass
class ReplayChunk:
    """What one chunk did: messages walked, jobs queued (moved or new), and where it stopped
    (the keyset of the last message; None when the window is exhausted)."""

    messages: int
    queued: int
    after_at: object
    after_id: int | None


def jobs_replay_chunk(*, channel_pk: int, consumer_pk: int, after_at, after_id: int, until,
                      only_failed: bool, limit: int) -> ReplayChunk:
    """One chunk of a replay, one statement (its own transaction outside one). The moves' history
    is the trigger's (reason ``replay``); the new jobs' NULL -> QUEUED rows the statement's own."""
    transitions_check(REPLAY_MOVES, "replay")
    walked, queued, last_at, last_id, _ = query_fetchone(Q.replay_chunk, {
        "channel": channel_pk, "consumer": consumer_pk, "after_at": after_at, "after_id": after_id,
        "until": until, "only_failed": bool(only_failed), "limit": int(limit)})
    return ReplayChunk(messages=int(walked), queued=int(queued), after_at=last_at, after_id=last_id)


CHUNK = 10_000  # messages per statement (and per transaction)
# After each chunk the replay rests this many seconds per second the chunk took, so it uses at
# most 1 / (1 + PAUSE) of a database core. Measured with bench/replay.py on the 2-core machine
# (publishing beside a 100k-message replay, as a share of its speed alone): no rests 0.73-0.88,
# PAUSE 0.5: 0.69 quiet, PAUSE 1.5: 0.82 and 0.88 quiet (the issue allows a 20% slowdown).
PAUSE = 1.5


@dataclass
class ReplayResult:
    """``replayed``: messages that got a QUEUED job again (moved back or new); ``skipped``: the
    other messages of the window (job QUEUED or in flight, partitioned, or not DEAD with
    ``only_failed``)."""

    replayed: int
    skipped: int
    seconds: float = 0.0
    after: tuple | None = None  # (received_at, id) to go on from when it stopped at its deadline; None: done

    def as_json(self) -> dict:
        return {"Replayed": self.replayed, "Skipped": self.skipped}


def replay_window_check(*, since: datetime, until: datetime | None, now: datetime) -> datetime:
    """The window's end (``now`` when omitted); 400 when it ends before it starts or lies entirely
    in the future (nothing could have been received there)."""
    if since > now:
        raise InvalidInput("invalid_window", "the window lies in the future: since must not be after now")
    end = until if until is not None else now
    if end < since:
        raise InvalidInput("invalid_window", "until must not be before since")
    return end


def consumer_replay(*, consumer: Consumer, since: datetime, until: datetime | None = None,
                    only_failed: bool = False, source: str = "api", chunk: int = CHUNK,
                    after: tuple | None = None, deadline: float | None = None,
                    carried: tuple[int, int] = (0, 0)) -> ReplayResult:
    """Give ``consumer`` a fresh QUEUED job for every message of its channel received in [since,
    until] and still stored: DELIVERED and DEAD jobs go back to QUEUED (retry count 0), messages
    without a job of this consumer get one; with ``only_failed`` only DEAD jobs are replayed.
    Jobs QUEUED or in flight now, and partitioned jobs, are skipped. Call it outside a
    transaction: each chunk commits on its own.

    In turns (the portal's replay task): ``deadline`` (``time.monotonic()``) stops it after the
    chunk that passes it, returning the counts so far and ``after``, the keyset to go on from,
    given back as ``after`` (with the counts as ``carried``: replayed, skipped) to the next turn
    (``until`` fixed by the first); the turn that ends the window records the advisory."""
    started = time.monotonic()
    end = replay_window_check(since=since, until=until, now=db_now()) if after is None else until
    after_at, after_id = (since, 0) if after is None else after
    queued, walked = carried[0], carried[0] + carried[1]
    while True:
        chunk_started = time.monotonic()
        part = jobs_replay_chunk(channel_pk=consumer.channel_id, consumer_pk=consumer.pk, after_at=after_at,
                                 after_id=after_id, until=end, only_failed=only_failed, limit=chunk)
        walked += part.messages
        queued += part.queued
        if part.messages < chunk:
            break
        after_at, after_id = part.after_at, part.after_id
        time.sleep((time.monotonic() - chunk_started) * PAUSE)
        if deadline is not None and time.monotonic() >= deadline:
            return ReplayResult(replayed=queued, skipped=walked - queued, seconds=time.monotonic() - started,
                                after=(after_at, after_id))
    result = ReplayResult(replayed=queued, skipped=walked - queued, seconds=time.monotonic() - started)
    advisory_record(type="replay", channel=consumer.channel.channel_id, consumer=consumer.consumer_id,
                    consumer_pk=consumer.pk,
                    data={"since": rfc3339(since), "until": rfc3339(end), "only_failed": bool(only_failed),
                          "replayed": result.replayed, "skipped": result.skipped, "source": source})
    return result
