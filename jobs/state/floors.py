"""Scan floors: where a walk of a churning job index may begin, so a long reader costs little (issue 35).

The claims, the sweeps and a waiting pull's wake-up walk partial indexes of the jobs in one state:
QUEUED jobs of a consumer by priority and id, queued retries by next attempt, in-flight jobs by
deadline. Every job that leaves the state leaves a dead entry at the head of that walk. Vacuum
removes them within seconds, but while any session holds an old snapshot (a report's long query,
an analyst's notebook) none can be removed or skipped, and every walk grows with the length of
the hold (measured: the push claim touched 15x the buffers per message after 96,000 messages
under a held snapshot, bench/storage.py). A floor is a lower bound on where the live entries
start, learnt from an earlier walk in this process, passed to the statement as a parameter:

- **positions** (priority level, job id) in a consumer's queue: the first QUEUED job the last walk
  saw at or past its floor (fresh or due; locked or not), but never past the ids handed out
  ``LAG`` seconds before that walk (the id sequence's value then, which every walk reads): a job
  committed after the walk with a lower id belongs to a transaction that was running during it,
  and transactions that write jobs end within ``LAG`` (a serving process's statements are bounded
  by BROKER_DB_TIMEOUT), so its id came from the sequence after that point. A floor skips only
  the ids below it at its own priority level; other levels are walked from their start.
- **times** (a retry's next attempt, an in-flight deadline): min(the first live value a walk saw,
  when it was seen minus ``LAG``), good at once: a row written later carries a time at or after
  its transaction's start, within ``LAG`` of its commit. The statements compute these themselves.

A floor only lets a walk skip dead entries, and is passed as a bound the statement checks; what
it could pass over (a straggler slower than ``LAG``, a retry that was not due yet, a job put back
below it: a replay, a spec-path requeue, a gate move, a DEAD job requeued) is found by the next
*full* walk, which every floor falls back to ``full_every()`` after the last one: normally within
``FULL_MIN`` seconds (a full walk costs next to nothing while vacuum keeps up), and, when a held
snapshot makes them long, no more often than keeps them under ``FULL_SHARE`` of the time (at most
``FULL_MAX`` apart). So the worst a floor does is make such a job wait that long. Floors live
in process memory, per consumer; nothing is written to the database.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

LAG = 1.0  # seconds: transactions that write jobs end within this (see the module docstring)
FULL_MIN = 0.25  # seconds between full walks while they are cheap
FULL_MAX = 30.0  # seconds between full walks at most
FULL_SHARE = 0.01  # full walks take at most this share of the time
INT_MAX = 2**31 - 1
# The position of a full walk: the highest priority level from id 0 (the walk's three ranges then
# cover every job: see claim_pull in jobs/pull/queries.sql).
FULL = (INT_MAX, 0)


@dataclass
class _Floor:
    seen: list = field(default_factory=list)  # position walks: [(monotonic time, level, first live, sequence)]
    full_at: float = float("-inf")  # when the last full walk began
    full_took: float = 0.0  # how long it took
    value: object = None  # a time floor (datetime): good at once


class Floors:
    """The floors of one kind of walk in this process, per key (a consumer pk, or None for a walk
    over every consumer)."""

    def __init__(self, *, lag: float = LAG) -> None:
        self.lag = lag
        self._floors: dict = {}
        self._lock = threading.Lock()

    def _floor(self, key) -> _Floor:
        floor = self._floors.get(key)
        if floor is None:
            floor = self._floors[key] = _Floor()
        return floor

    def full_due(self, key, now: float | None = None) -> bool:
        """Whether this walk must be a full one (none for too long; see the module docstring)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            floor = self._floor(key)
            return now - floor.full_at >= full_every(floor.full_took)

    def position(self, key, now: float | None = None) -> tuple[tuple[int, int], bool]:
        """(the position a walk starts at: (priority level, job id), whether it is a full walk)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            floor = self._floor(key)
            if not floor.seen or now - floor.full_at >= full_every(floor.full_took):
                return FULL, True
            last_at, level, first, _ = floor.seen[-1]
            handed = None  # the sequence as a walk LAG before the last one read it
            for at, _, _, sequence in floor.seen:
                if at > last_at - self.lag:
                    break
                handed = sequence
            if handed is None:
                return FULL, True
            if first is None:  # nothing live past the last floor: up to what was handed out then
                return (0 if level == FULL[0] else level, handed + 1), False
            return (first[0], min(first[1], handed + 1)), False

    def time(self, key, now: float | None = None):
        """(the time floor a walk starts at, None for a full walk; whether it is a full walk)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            floor = self._floor(key)
            if floor.value is None or now - floor.full_at >= full_every(floor.full_took):
                return None, True
            return floor.value, False

    def walked(self, key, *, began: float, full: bool, level: int | None = None, first=None,
               sequence: int | None = None, value=None, now: float | None = None) -> None:
        """A walk that began at ``began`` (monotonic). A position walk from priority ``level`` saw
        ``first`` (the first live (priority, id) at or past its floor, None: none) and read the id
        sequence at ``sequence``; a time walk computed the floor ``value`` (None: keep what is known)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            floor = self._floor(key)
            if full:
                floor.full_at, floor.full_took = began, max(0.0, now - began)
            if sequence is not None:
                floor.seen.append((began, FULL[0] if level is None else level, first, sequence))
                # keep the newest walk LAG before the newest one, and the walks after it
                while len(floor.seen) > 2 and floor.seen[1][0] <= began - self.lag:
                    floor.seen.pop(0)
                if len(floor.seen) > 64:  # walks more often than LAG / 64: keep every other one
                    floor.seen = floor.seen[:1] + floor.seen[1:-1:2] + floor.seen[-1:]
            if value is not None:
                floor.value = value

    def reset(self, key=None) -> None:
        """Forget ``key``'s floor (every floor when None): its next walk is a full one. For a
        process that just put jobs back below a floor (a gate move, a requeue)."""
        with self._lock:
            if key is None:
                self._floors.clear()
            else:
                self._floors.pop(key, None)

    def keys(self) -> list:
        with self._lock:
            return list(self._floors)

    def forget(self, keys) -> None:
        """Drop the floors of keys no longer walked (deleted consumers)."""
        with self._lock:
            for key in keys:
                self._floors.pop(key, None)


def full_every(took: float) -> float:
    """Seconds between full walks when the last one took ``took`` seconds."""
    return min(FULL_MAX, max(FULL_MIN, took / FULL_SHARE))


def consumer_reset(consumer_pk: int) -> None:
    """Jobs of ``consumer_pk`` went back to QUEUED below the floors (a gate move, a requeue, a
    replay): this process's next walks of its queue are full ones (other processes find them at
    their next full walk)."""
    for kind in (CLAIM_PULL, CLAIM_PUSH, RETRIES_PULL, RETRIES_PUSH):
        kind.reset(consumer_pk)


# One set per kind of walk, in every process that walks.
CLAIM_PULL = Floors()  # a pull consumer's queue (claim_pull, pull_next): positions
CLAIM_PUSH = Floors()  # push consumers' fresh jobs (claim_push): positions
RETRIES_PUSH = Floors()  # push consumers' retries (claim_push): times
RETRIES_PULL = Floors()  # a pull consumer's retries (pull_next): times
DEADLINES = Floors()  # in-flight deadlines (expire_inflight; a consumer's, pull_next): times
EXPIRIES = Floors()  # QUEUED jobs by message expiry (expire_messages): times
