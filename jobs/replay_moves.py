"""The replay's status writer: one chunk of a replay (``replay_chunk`` in jobs/queries.sql),
DELIVERED / DEAD -> QUEUED (kind ``replay``) and fresh QUEUED jobs for messages without one."""

from __future__ import annotations

from dataclasses import dataclass

from broker.db.run import query_fetchone
from jobs.queries import Q
from jobs.transitions import DEAD, DELIVERED, QUEUED, transitions_check

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
