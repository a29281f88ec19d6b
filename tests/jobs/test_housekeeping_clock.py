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
