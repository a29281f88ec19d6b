"""DB-free: the housekeeping clock runs each step at its own period, and a failing step neither
stops the others nor the loop."""

from __future__ import annotations

from django.db import DatabaseError

from jobs import housekeeping
from jobs.housekeeping import Housekeeping, Step, housekeeping_run


def recorder(log, name, result=0):
    def run():
        log.append(name)
        return result
    return run


def test_each_step_runs_at_start_then_at_its_period():
    log = []
    steps = (Step("fast", recorder(log, "fast"), 1.0), Step("slow", recorder(log, "slow"), 5.0))
    clock = Housekeeping(start=100.0, steps=steps)
    assert clock.next_due() == 100.0
    for now in (100.0, 100.5, 101.0, 102.0, 103.0, 104.0, 105.0):
        if now >= clock.next_due():
            clock.run_due(now)
    assert log == ["fast", "slow", "fast", "fast", "fast", "fast", "fast", "slow"]
    assert clock.next_due() == 106.0


def test_a_failing_step_is_logged_and_the_others_run(monkeypatch):
    closed = []
    monkeypatch.setattr(housekeeping.connection, "close", lambda: closed.append(True))

    def broken():
        raise DatabaseError("server closed the connection")

    log = []
    result = housekeeping_run(steps=(Step("a", broken, 1.0), Step("b", recorder(log, "b", 3), 1.0)))
    assert result == {"a": None, "b": 3}
    assert log == ["b"] and closed == [True]


def test_a_step_left_to_the_schedule_does_not_keep_the_loop_awake():
    """A step only the fallback schedule runs (``in_loops=False``) has no due time in a loop's clock:
    before, its entry stayed at the loop's start and ``next_due`` stayed in the past, so the push
    dispatcher's loop never slept (one to two cores burnt by an idle broker)."""
    steps = (Step("loop", recorder([], "loop"), 1.0), Step("scheduled", recorder([], "scheduled"), 60.0, in_loops=False))
    clock = Housekeeping(start=100.0, steps=steps)
    clock.run_due(100.0)
    assert clock.next_due() == 101.0


def test_a_step_that_finds_nothing_waits_its_idle_period_then_its_own_again():
    log, results = [], iter([0, 0, 4, 0])

    def run():
        log.append("x")
        return next(results)

    clock = Housekeeping(start=0.0, steps=(Step("x", run, 1.0, idle_every=3.0),))
    clock.run_due(0.0)
    assert clock.next_due() == 3.0  # found nothing: idle period
    clock.run_due(3.0)
    assert clock.next_due() == 6.0
    clock.run_due(6.0)  # did work: back to every second
    assert clock.next_due() == 7.0
    clock.run_due(7.0)
    assert clock.next_due() == 10.0 and log == ["x"] * 4
