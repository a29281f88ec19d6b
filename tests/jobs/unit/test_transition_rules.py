"""The job transition table and its guard, without a database: the table is exactly the moves the
state machine documents, and an illegal move is refused before any SQL runs (a unit test has no
database: reaching one would fail the test)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.db.errors import IllegalTransition
from jobs.models import JobStatus
from jobs.state.transitions import ALLOWED, DEAD, DELIVERED, GONE, INFLIGHT, QUEUED
from tests.jobs.moves import Move, job_move, jobs_move

STATUSES = [s.value for s in JobStatus]
ILLEGAL = sorted(set(itertools.product(STATUSES, STATUSES)) - ALLOWED)

# The moves of the module docstring (jobs/state/transitions.py): the contract the table encodes.
DOCUMENTED = {
    (QUEUED, INFLIGHT),     # claimed by a push worker or a pull client
    (INFLIGHT, DELIVERED),  # success
    (INFLIGHT, DEAD),       # the consumer gives up, or retries are exhausted
    (INFLIGHT, QUEUED),     # deadline passed or attempt failed
    (DEAD, INFLIGHT),       # a pull consumer retries a dead job
    (DEAD, QUEUED),         # an operator / the DLQ requeues it
    (QUEUED, DEAD),         # its message expired (or an operator marks it dead)
    (DELIVERED, QUEUED),    # a replay delivers it again (jobs/replay.py)
    (QUEUED, GONE),         # a queued job is purged (deleted, history row to GONE)
    (DEAD, GONE),           # a dead job is deleted (DLQ delete, partition skip)
}


def test_the_table_is_the_documented_state_machine():
    assert ALLOWED == DOCUMENTED
    assert {QUEUED, INFLIGHT, DELIVERED, DEAD} == set(STATUSES), "four states, no more"


def test_delivered_leaves_only_by_replay_and_no_state_moves_to_itself():
    assert [m for m in ALLOWED if m[0] == DELIVERED] == [(DELIVERED, QUEUED)]
    assert not [m for m in ALLOWED if m[0] == m[1]]


def test_every_state_is_reachable_from_queued_and_none_is_a_dead_end():
    reached, frontier = {QUEUED}, [QUEUED]
    while frontier:
        here = frontier.pop()
        for a, b in ALLOWED:
            if a == here and b not in reached:
                reached.add(b)
                frontier.append(b)
    assert reached == set(STATUSES) | {GONE}
    terminal = {s for s in STATUSES if not any(a == s for a, _ in ALLOWED)}
    assert terminal == set()  # DELIVERED leaves only by a replay, DEAD by a retry or requeue


def test_nothing_but_a_claim_enters_inflight_from_queued_and_nothing_skips_inflight_to_delivered():
    assert {a for a, b in ALLOWED if b == DELIVERED} == {INFLIGHT}
    assert {a for a, b in ALLOWED if b == INFLIGHT} == {QUEUED, DEAD}


@pytest.mark.parametrize("move", ILLEGAL, ids=lambda m: f"{JobStatus(m[0]).name}->{JobStatus(m[1]).name}")
def test_an_illegal_move_is_refused_before_sql(move):
    with pytest.raises(IllegalTransition, match=f"{move[0]} -> {move[1]}"):
        jobs_move(moves=[Move(job_id=1, from_status=move[0], to_status=move[1])], reason="unit")
    with pytest.raises(IllegalTransition):
        job_move(job_id=1, from_status=move[0], to_status=move[1], reason="unit")


@given(st.lists(st.sampled_from(sorted(ALLOWED)), max_size=5), st.sampled_from(ILLEGAL),
       st.lists(st.sampled_from(sorted(ALLOWED)), max_size=5))
def test_one_illegal_move_refuses_the_whole_batch(before, bad, after):
    moves = [Move(job_id=i + 1, from_status=a, to_status=b) for i, (a, b) in enumerate([*before, bad, *after])]
    with pytest.raises(IllegalTransition):
        jobs_move(moves=moves, reason="unit")


def test_an_empty_batch_moves_nothing_without_sql():
    assert jobs_move(moves=[], reason="unit") == {}

