"""The dashboard's alert rules and figures, without a database: each rule over a consumer's
figures (``jobs.ops.dashboard.ConsumerStats``) and the per-minute series they read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.ops.dashboard import (ALERT_RULES, FAILURE_MIN_ATTEMPTS, GROWTH_MIN, MINUTES, PIN_CHURN, STALL_AGE,
                                ConsumerStats, Series, dead_jobs_present, duration_text)


def _stats(series=None, consumer=None, **figures) -> ConsumerStats:
    return ConsumerStats(consumer=consumer or SimpleNamespace(paused=False, max_queued=None),
                         series=series or Series(), **figures)


def _alerts(stats: ConsumerStats) -> dict[str, str]:
    """{kind: level} of every alert the registered rules raise."""
    return {a.kind: a.level for rule in ALERT_RULES for a in rule(stats)}


def _series(**last) -> Series:
    """A series whose newest minutes hold the given per-minute values: name=(value, minutes)."""
    s = Series()
    for name, (value, minutes) in last.items():
        values = getattr(s, name)
        for i in range(MINUTES - minutes, MINUTES):
            values[i] = value
    return s


def test_the_registered_rules():
    assert [r.__name__ for r in ALERT_RULES] == ["dead_jobs_present", "backlog_growing", "backlog_stalled",
                                                 "failing", "consumer_paused", "backlog_cap_reached", "pin_churn"]


def test_a_quiet_consumer_raises_nothing():
    assert _alerts(_stats()) == {}
    assert _alerts(_stats(queued=5, oldest_queued_age=10.0, series=_series(delivered=(3, 10)))) == {}


def test_dead_jobs():
    assert _alerts(_stats(dead=1)) == {"dead": "error"}
    assert [a.text for a in dead_jobs_present(_stats(dead=1234))] == ["1,234 dead jobs"]
    assert [a.text for a in dead_jobs_present(_stats(dead=1))] == ["1 dead job"]


def test_backlog_growing_needs_queued_jobs_a_minimum_and_a_share():
    growing = _series(created=(5, 10))  # +50 in 10 min, nothing delivered
    assert _alerts(_stats(queued=50, series=growing)) == {"backlog": "warning"}
    assert _alerts(_stats(queued=0, series=growing)) == {}, "nothing queued: drained, not growing"
    small = _series(created=(1, GROWTH_MIN - 1))
    assert "backlog" not in _alerts(_stats(queued=9, series=small))
    churn = _series(created=(200, 10), delivered=(195, 10))  # +50 of 2000 created: under 10 %
    assert "backlog" not in _alerts(_stats(queued=50, series=churn))


def test_backlog_stalled():
    assert _alerts(_stats(queued=3, oldest_queued_age=STALL_AGE + 1)) == {"stalled": "error"}
    assert _alerts(_stats(queued=3, oldest_queued_age=STALL_AGE)) == {}
    assert _alerts(_stats(queued=3, oldest_queued_age=STALL_AGE + 1, series=_series(delivered=(1, 1)))) == {}
    assert _alerts(_stats(queued=0, oldest_queued_age=STALL_AGE + 1)) == {}


@pytest.mark.parametrize("failed, delivered, level", [
    (1, 9, "warning"), (5, 5, "error"), (0, 10, None), (4, 0, None), (9, 91, None)])
def test_failing(failed, delivered, level):
    s = Series()
    s.retried[-1], s.delivered[-1] = failed, delivered
    assert _alerts(_stats(series=s)).get("failing") == level
    assert failed + delivered >= FAILURE_MIN_ATTEMPTS or level is None


def test_flow_control_and_pins():
    assert _alerts(_stats(queued=7, consumer=SimpleNamespace(paused=True, max_queued=None))) == {"paused": "warning"}
    full = SimpleNamespace(paused=False, max_queued=10)
    assert _alerts(_stats(queued=10, consumer=full)) == {"backlog-full": "error"}
    assert _alerts(_stats(queued=9, consumer=full)) == {}
    assert _alerts(_stats(pin_changes=PIN_CHURN)) == {"pin-churn": "warning"}
    assert _alerts(_stats(pin_changes=PIN_CHURN - 1)) == {}


COUNTS = st.lists(st.integers(min_value=0, max_value=1000), min_size=MINUTES, max_size=MINUTES)


@given(COUNTS, COUNTS, COUNTS, COUNTS, COUNTS, st.integers(min_value=0, max_value=10**6))
def test_backlog_series_ends_at_the_current_value_and_steps_by_each_minutes_flow(c, d, r, x, q, now_value):
    s = Series(created=c, delivered=d, retried=r, dead=x, requeued=q)
    values = s.backlog(now_value)
    assert values[-1] == now_value and all(v >= 0 for v in values)
    assert s.failed == [a + b for a, b in zip(r, x)]
    assert s.last("created", 5) == sum(c[-5:]) and s.last("created", 5, complete=True) == sum(c[-6:-1])
    total = Series()
    total.add(s)
    total.add(s)
    assert total.created == [2 * v for v in c]


def test_per_minute_counts_the_partial_minute_by_its_elapsed_time():
    s = _series(delivered=(60, 5))
    assert s.per_minute("delivered", 5, 60.0) == pytest.approx(60.0)
    assert s.per_minute("delivered", 5, 30.0) == pytest.approx(300 / 4.5)
    assert s.per_minute("delivered", 5, 0.0) == s.per_minute("delivered", 5, 1.0), "at least one second"


def test_failure_rate():
    s = Series()
    s.delivered[0], s.dead[1], s.retried[2] = 6, 1, 1
    assert _stats(series=s).failure_rate == 0.25
    assert _stats().failure_rate is None


@pytest.mark.parametrize("seconds, text", [(None, "-"), (-5, "0 s"), (45, "45 s"), (89, "89 s"), (90, "2 min"),
                                           (3600, "60 min"), (5400, "1.5 h"), (48 * 3600, "2.0 d")])
def test_duration_text(seconds, text):
    assert duration_text(seconds) == text
