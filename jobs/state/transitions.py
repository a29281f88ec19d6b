"""The job transition table: every status a job may move to from every status, and which kind of
move may make it. Pure data and pure checks, no database.

One table drives every status write: each writer (docs/architecture.md lists them) checks its
moves here before any SQL (``transition_check``), and the database enforces the same pairs (the
history trigger of migration 0017 writes them out and raises SQLSTATE ``BRK01`` for any other;
tests/jobs/test_transitions.py tries every pair against it), so an illegal move fails with
``IllegalTransition`` whichever path made it, raw SQL included. The same trigger is the one
history writer: every status change (and every delete with a reason) appends one
``jobs_jobtransition`` row.

States (webhook-broker's integers) and moves:

    QUEUED   -> INFLIGHT   claim: a push worker or a pull client takes the job
    INFLIGHT -> DELIVERED  deliver: success
    INFLIGHT -> QUEUED     retry / timeout / gate: failed attempt, deadline passed, next gate
    INFLIGHT -> DEAD       give_up / retry / timeout: the consumer gives up, or retries ran out
    DEAD     -> INFLIGHT   retry_dead: a pull consumer retries a dead job (retry + 1)
    DEAD     -> QUEUED     requeue / replay: the DLQ / an operator requeues it, or a replay (retry reset)
    DELIVERED -> QUEUED    replay: deliver a delivered message again (jobs.publish.replay, retry reset)
    QUEUED   -> DEAD       mark_dead / expired: an operator gives up on a job (also INFLIGHT -> DEAD),
                           or its message expired (jobs.sweeps.message_expiry)
    QUEUED   -> GONE       purge: the job is deleted from a runaway backlog
    DEAD     -> GONE       delete: a dead job is deleted (DLQ delete, partition skip)

GONE (0) is the ``to_status`` of the history row of a deleted job: it has no status any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from broker.db.errors import IllegalTransition
from jobs.models import JobStatus

QUEUED = JobStatus.QUEUED.value
INFLIGHT = JobStatus.INFLIGHT.value
DELIVERED = JobStatus.DELIVERED.value
DEAD = JobStatus.DEAD.value
GONE = 0
STATUSES = (QUEUED, INFLIGHT, DELIVERED, DEAD)  # what a job row holds (GONE is a history row's only)
# the one status-name map: the API, the admin, advisories and the partitions' counts read it
STATUS_NAMES = {QUEUED: "QUEUED", INFLIGHT: "INFLIGHT", DELIVERED: "DELIVERED", DEAD: "DEAD", GONE: "GONE"}


@dataclass(frozen=True)
class Transition:
    from_status: int
    to_status: int
    kinds: frozenset[str]


def _t(from_status: int, to_status: int, *kinds: str) -> Transition:
    return Transition(from_status, to_status, frozenset(kinds))


TRANSITIONS: tuple[Transition, ...] = (
    _t(QUEUED, INFLIGHT, "claim"),
    _t(INFLIGHT, DELIVERED, "deliver"),
    _t(INFLIGHT, QUEUED, "retry", "timeout", "gate", "orphaned"),
    _t(INFLIGHT, DEAD, "give_up", "retry", "timeout", "mark_dead"),
    _t(DEAD, INFLIGHT, "retry_dead"),
    _t(DEAD, QUEUED, "requeue", "replay"),
    _t(DELIVERED, QUEUED, "replay"),
    _t(QUEUED, DEAD, "mark_dead", "expired"),
    _t(QUEUED, GONE, "purge"),
    _t(DEAD, GONE, "delete"),
)


# (from, to) pairs: what the database's history trigger allows (migrations 0017, 0019)
ALLOWED: frozenset[tuple[int, int]] = frozenset((t.from_status, t.to_status) for t in TRANSITIONS)
KINDS: dict[tuple[int, int], frozenset[str]] = {(t.from_status, t.to_status): t.kinds for t in TRANSITIONS}
ALL_KINDS: frozenset[str] = frozenset().union(*(t.kinds for t in TRANSITIONS))


def _name(status: int) -> str:
    return STATUS_NAMES.get(status, str(status))


def transition_check(from_status: int, to_status: int, kind: str | None = None) -> None:
    """Raise IllegalTransition unless ``from_status -> to_status`` is in the table (and, with
    ``kind``, is a move of that kind: a claim never delivers, a sweep never requeues a dead job)."""
    kinds = KINDS.get((from_status, to_status))
    if kinds is None:
        raise IllegalTransition(f"a job cannot move from {_name(from_status)} to {_name(to_status)} "
                                f"({from_status} -> {to_status})")
    if kind is not None and kind not in kinds:
        raise IllegalTransition(f"a {kind} move cannot take a job from {_name(from_status)} to {_name(to_status)}")


def transitions_check(pairs: Iterable[tuple[int, int]], kind: str | None = None) -> None:
    """``transition_check`` for every (from, to) pair (each distinct pair checked once)."""
    for from_status, to_status in set(pairs):
        transition_check(from_status, to_status, kind)
