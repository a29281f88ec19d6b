"""Retry policy without a database: webhook-broker's backoff steps, the retry limit and the in-flight
deadline (stopTimeout + rationalDelay + IncrementalTimeout)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.state.retries import backoff_delay, inflight_timeout, max_retry_for, stop_timeout

STEPS = st.lists(st.floats(min_value=0.001, max_value=1e5, allow_nan=False), min_size=1, max_size=6)
RETRIES = st.integers(min_value=-3, max_value=500)


def test_default_steps_then_linear_growth_by_the_last(settings):
    settings.BROKER_RETRY_BACKOFF = [5.0, 30.0, 60.0]
    got = [backoff_delay(n, jitter=False) for n in range(1, 7)]
    assert got == [5.0, 30.0, 60.0, 120.0, 180.0, 240.0]


def test_retry_below_one_counts_as_the_first():
    assert backoff_delay(0, [7.0, 9.0], jitter=False) == 7.0
    assert backoff_delay(-4, [7.0, 9.0], jitter=False) == 7.0


def test_no_steps_falls_back_to_five_seconds(settings):
    settings.BROKER_RETRY_BACKOFF = []
    assert backoff_delay(1, jitter=False) == 5.0
    assert backoff_delay(3, [], jitter=False) == 15.0


@given(STEPS, RETRIES)
def test_within_the_list_the_nth_step_beyond_it_multiples_of_the_last(steps, retry):
    n = max(retry, 1)
    expected = steps[n - 1] if n < len(steps) else (n - len(steps) + 1) * steps[-1]
    assert backoff_delay(retry, steps, jitter=False) == pytest.approx(expected)


@given(STEPS, RETRIES)
def test_jitter_adds_at_most_ten_percent(steps, retry):
    base = backoff_delay(retry, steps, jitter=False)
    jittered = backoff_delay(retry, steps)
    assert base <= jittered <= base * 1.1 + 1e-9


@given(st.lists(st.floats(min_value=0.001, max_value=1e5), min_size=1, max_size=6).map(sorted), RETRIES)
def test_growing_steps_never_shorten_the_next_delay(steps, retry):
    assert backoff_delay(retry + 1, steps, jitter=False) >= backoff_delay(retry, steps, jitter=False)


def test_zero_delay_gets_no_jitter():
    assert backoff_delay(1, [0.0, 5.0]) == 0.0


def test_max_retry_is_the_consumers_or_the_brokers(settings):
    settings.BROKER_MAX_RETRY = 5
    assert max_retry_for(None) == 5
    assert max_retry_for(0) == 0
    assert max_retry_for(12) == 12
    assert max_retry_for("3") == 3


def test_inflight_deadline_is_stop_timeout_plus_rational_delay_plus_increment(settings):
    settings.BROKER_CONNECTION_TIMEOUT = 30.0
    settings.BROKER_RATIONAL_DELAY = 2.0
    assert stop_timeout() == 30.25
    assert stop_timeout(10) == 10.25
    assert inflight_timeout() == 32.25
    assert inflight_timeout(15) == 47.25
    assert inflight_timeout(None, 4) == 6.25
    assert inflight_timeout(0.5, connection_timeout=0) == 2.75


@given(st.floats(min_value=0, max_value=1e6), st.floats(min_value=0, max_value=1e4))
def test_a_longer_increment_never_shortens_the_deadline(increment, extra):
    assert inflight_timeout(increment + extra) >= inflight_timeout(increment)
