"""Scan floors (jobs.state.floors): when a walk may skip, and where it starts."""

from __future__ import annotations

import pytest

from jobs.state.floors import FULL, FULL_MAX, FULL_MIN, FULL_SHARE, Floors, full_every


def test_a_new_key_is_walked_in_full():
    floors = Floors(lag=1.0)
    assert floors.position(7, now=100.0) == (FULL, True)
    assert floors.time(7, now=100.0) == (None, True)


def test_a_position_serves_once_a_walk_lag_before_it_read_the_sequence():
    floors = Floors(lag=1.0)
    # a full walk of half a second (a held snapshot's dead entries): the next one FULL_MAX later
    floors.walked(7, began=100.0, full=True, level=FULL[0], first=(0, 50), sequence=60, now=100.5)
    # the only walk is the last one: nothing was read LAG before it, so the next walk is full again
    assert floors.position(7, now=100.2) == (FULL, True)
    floors.walked(7, began=101.5, full=False, level=0, first=(0, 80), sequence=90, now=101.5)
    # the walk at 100.0 is LAG before the one at 101.5: ids up to 60 were final by then
    assert floors.position(7, now=101.6) == ((0, 61), False)


@pytest.mark.parametrize(("first_before", "first_after", "floor"), [
    ((0, 10), (0, 40), (0, 40)),  # a position never passes the first live job
    (None, None, (0, 61)),  # no live job: the floor is what was handed out a lag before
    ((0, 10), (5, 70), (5, 61)),  # a higher priority job moves the floor to its level
])
def test_where_a_position_floors(first_before, first_after, floor):
    floors = Floors(lag=1.0)
    floors.walked(7, began=100.0, full=True, level=FULL[0], first=first_before, sequence=60, now=100.5)
    floors.walked(7, began=101.5, full=False, level=0, first=first_after, sequence=90)
    assert floors.position(7, now=101.6) == (floor, False)


def test_full_walks_come_back_by_their_cost():
    floors = Floors(lag=1.0)
    floors.walked(7, began=100.0, full=True, level=FULL[0], first=(0, 1), sequence=5, now=100.0 + 0.02)
    floors.walked(7, began=101.5, full=False, level=0, first=(0, 1), sequence=9, now=101.5)
    # the full walk took 20 ms: the next one is due full_every(0.02) after it began
    every = full_every(0.02)
    assert every == 0.02 / FULL_SHARE
    assert floors.position(7, now=100.0 + every - 0.01)[1] is False
    assert floors.position(7, now=100.0 + every) == (FULL, True)


def test_full_every_is_bounded():
    assert full_every(0.0) == FULL_MIN
    assert full_every(3600.0) == FULL_MAX


def test_time_floors_serve_at_once_and_reset_forgets():
    floors = Floors(lag=1.0)
    floors.walked(None, began=100.0, full=True, value="2026-01-01T00:00:00Z", now=100.0)
    assert floors.time(None, now=100.01) == ("2026-01-01T00:00:00Z", False)
    floors.walked(None, began=100.1, full=False, value=None)  # a walk that learnt nothing keeps the floor
    assert floors.time(None, now=100.2) == ("2026-01-01T00:00:00Z", False)
    floors.reset(None)
    assert floors.time(None, now=100.3) == (None, True)


def test_many_walks_keep_a_bounded_history():
    floors = Floors(lag=1.0)
    for i in range(1000):
        floors.walked(7, began=100.0 + i * 0.002, full=i == 0, level=0, first=(0, i), sequence=i,
                      now=100.5 + i * 0.002)
    assert len(floors._floors[7].seen) <= 64
    (level, first), full = floors.position(7, now=102.0)
    assert level == 0 and not full and first <= 999
