"""DB-free: admission by the push deliveries' lag. A dispatcher engine's figure (jobs.push.lag: the
shortest, across the consumers that count, of their longest wait from due to claimed, reported once
a period and only while it or the last report is not zero), and the rate of publishes taken
from it (jobs.publish.admission.admit_rate_next) with its token bucket."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.publish import admission
from jobs.publish.admission import (
    BACKLOG, BUCKET, CATCHING_UP, CUT_MAX, HOLD_MAX, INCREASE, INCREASE_OFFERED, MARGIN, RATE_MIN, READ_EVERY, STALE,
    STEADY,
    admit_rate_next, cut_hold,
)
from jobs.push.claim import PushJob
from jobs.push.lag import PERIOD, DeliveryLag, lag_figure

pytestmark = pytest.mark.unit


def job(consumer: int, waited: float | None, *, dirty: bool = False, room: int | None = None) -> PushJob:
    return PushJob(id=1, consumer_pk=consumer, priority=0, retry_count=0, message_id="m", payload=b"",
                   content_type="", headers={}, consumer_updated_at=None, waited=waited, circuit_dirty=dirty,
                   room=room)


def test_the_figure_is_the_shortest_of_the_consumers_longest_waits():
    assert lag_figure({}) == 0.0
    assert lag_figure({1: 4.0, 2: 0.0123456}) == 0.012  # one consumer behind alone: not the broker
    assert lag_figure({1: 4.0, 2: 3.5}) == 3.5  # every consumer behind: the broker is


def test_paced_consumers_failing_endpoints_and_silent_periods_do_not_count():
    lag = DeliveryLag()
    targets = {1: SimpleNamespace(rate=None), 2: SimpleNamespace(rate=50.0)}
    lag.observe([job(1, 5.0), job(1, 6.0), job(2, 9.0), job(3, 30.0, dirty=True), job(4, None), job(5, 40.0),
                 job(6, 50.0, room=1)], targets=targets, saturated={5}, now=100.0)
    assert lag.due(100.0 + PERIOD / 2) is None  # the period is not over
    # consumer 1's longest: 2 is paced, 3's circuit was failing, 5 had no room left at the claim before,
    # and this claim took all of 6's room: their jobs waited for their own endpoints
    assert lag.due(100.0 + PERIOD) == 6.0
    lag.written(6.0)
    lag.observe([], targets={}, saturated=set(), now=101.5)
    assert lag.due(102.0 + PERIOD) == 0.0  # a period without claims says 0 once (the last report was not)
    lag.written(0.0)
    assert lag.due(103.0 + 2 * PERIOD) is None  # ... and then nothing is written while all is well


def test_an_engine_behind_with_one_consumer_and_not_with_another():
    lag = DeliveryLag()
    # 1's endpoint is slow, 2 is served soon
    lag.observe([job(1, 12.0), job(2, 0.3)], targets={}, saturated=set(), now=0.0)
    assert lag.due(PERIOD) == 0.3
    lag.written(0.3)
    lag.observe([job(1, 13.0), job(2, 0.02)], targets={}, saturated=set(), now=PERIOD)
    assert lag.due(2 * PERIOD) == 0.0  # (under QUIET: as if zero)


def rate(limit, *, taken=3000.0, offered=6000.0, lag=3.0, growth=0.0, since_cut=float("inf")):
    return admit_rate_next(limit=limit, taken=taken, offered=offered, lag=lag, growth=growth, target=1.0,
                           since_cut=since_cut)


def test_under_the_bound_nothing_is_limited_however_the_lag_moves():
    assert rate(None, lag=0.5, growth=5.0) is None
    assert rate(None, lag=0.0) is None


def test_over_the_bound_the_rate_is_cut_to_what_the_deliveries_carry():
    # growing 0.4 s a second: the deliveries carry 60 % of what is taken; MARGIN under that
    assert rate(None, taken=3000.0, growth=0.4) == pytest.approx(1800.0 * MARGIN)
    # from the rate in force when less is taken than it allows ... and from what is taken otherwise
    assert rate(2000.0, taken=1000.0, growth=0.4) == pytest.approx(600.0 * MARGIN)
    assert rate(800.0, taken=1000.0, growth=0.4) == pytest.approx(480.0 * MARGIN)


def test_a_cut_has_its_bounds():
    assert rate(None, taken=3000.0, growth=0.0) == pytest.approx(3000.0 * MARGIN)  # holding: the margin alone
    assert rate(None, taken=3000.0, growth=0.9) == pytest.approx(3000.0 * (1 - CUT_MAX))  # at most half
    assert rate(None, taken=3000.0, growth=5.0) == pytest.approx(3000.0 * (1 - CUT_MAX))
    assert rate(None, taken=4.0, growth=0.9) == RATE_MIN  # some publishes always go through


def test_a_cut_is_given_time_to_show_before_the_next():
    hold = cut_hold(3.0)
    assert hold == pytest.approx(min(HOLD_MAX, 1.5 * 3.0 + READ_EVERY))
    assert rate(1000.0, taken=1000.0, growth=0.4, since_cut=hold - 0.1) == 1000.0  # the backlog's lag: wait
    assert rate(1000.0, taken=1000.0, growth=0.4, since_cut=hold) == pytest.approx(600.0 * MARGIN)  # still growing
    assert cut_hold(600.0) == HOLD_MAX


def test_over_the_bound_and_catching_up_the_rate_holds():
    assert rate(1200.0, growth=-2 * CATCHING_UP) == 1200.0
    assert rate(None, growth=-2 * CATCHING_UP) is None


def test_near_the_bound_the_rate_holds_and_under_it_rises_and_is_lifted_once_well_over_the_offer():
    assert rate(1000.0, lag=1.0) == 1000.0 and rate(1000.0, lag=STEADY + 0.01) == 1000.0
    # ... unless it shrinks (a burst's backlog drained): the rate rises, so a burst's end refuses nothing
    assert rate(1000.0, lag=0.8, growth=-0.2, offered=600.0) is None
    assert rate(1000.0, lag=STEADY - 0.01, offered=6000.0) == pytest.approx(1000.0 + INCREASE_OFFERED * 6000.0)
    assert rate(1000.0, lag=0.0, offered=1000.0) == pytest.approx(1000.0 * (1 + INCREASE))
    assert rate(1000.0, lag=0.0, offered=600.0) is None  # the burst is over: nothing refused
    assert rate(RATE_MIN, lag=0.0, offered=3000.0) == pytest.approx(RATE_MIN + INCREASE_OFFERED * 3000.0)


def test_an_old_backlog_drained_limits_nothing():
    """An endpoint back after an hour: its hours-old jobs are claimed (the lag is huge, and grows as
    the first of them go out); that is no load coming in too fast."""
    assert rate(None, lag=3600.0, growth=-0.05) is None
    assert rate(None, lag=3600.0, growth=5.0) is None
    assert rate(700.0, lag=BACKLOG + 1) is None


def test_off_limits_nothing():
    assert admit_rate_next(limit=500.0, taken=3000.0, offered=6000.0, lag=100.0, growth=10.0, target=0.0,
                           since_cut=float("inf")) is None


def test_the_token_bucket_takes_the_rate_and_refuses_the_rest(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(admission, "time", SimpleNamespace(monotonic=lambda: clock.now))
    gate = admission.LagAdmission()
    assert not any(gate.refuse() for _ in range(50))  # no rate in force: every publish taken
    gate.limit, gate._read_at, gate._tokens, gate._filled_at = 100.0, clock.now, 0.0, clock.now
    taken = 0
    for _ in range(2000):  # 2 s offered at 1,000/s against a rate of 100/s
        clock.now += 0.001
        taken += not gate.refuse()
    assert 190 <= taken <= 200 + 100 * BUCKET, taken
    clock.now += STALE + 1  # not refreshed (nothing published): the rate no longer applies
    assert not any(gate.refuse() for _ in range(50))
    assert (gate.taken, gate.offered) == (50 + taken + 50, 2100)
    gate.limit, gate._read_at = RATE_MIN, clock.now  # the smallest rate still takes its publishes
    taken = 0
    for _ in range(2000):
        clock.now += 0.001
        taken += not gate.refuse()
    assert 2 * RATE_MIN - 1 <= taken <= 2 * RATE_MIN + 1, taken


def test_consumers_held_by_their_room_count_while_the_cpu_is_starved_and_a_while_after(monkeypatch):
    """On a starved machine every answer is slow, the broker's own included: the consumers held by
    their maxInFlight count then (and for PRESSED_HOLD after: the shedding lowers the pressure)."""
    from jobs.push import lag as lag_module

    pressure = SimpleNamespace(value=0.9)
    monkeypatch.setattr(lag_module, "cpu_pressure", SimpleNamespace(share=lambda: pressure.value))
    lag = DeliveryLag()
    lag.observe([job(1, 4.0, room=1)], targets={}, saturated={1}, now=0.0)
    assert lag.due(PERIOD) == 4.0
    lag.written(4.0)
    pressure.value = 0.3
    lag.observe([job(1, 3.0, room=1)], targets={}, saturated={1}, now=PERIOD)
    assert lag.due(2 * PERIOD) == 3.0  # within PRESSED_HOLD of the last starved sample
    later = 2 * PERIOD + lag_module.PRESSED_HOLD
    lag.observe([job(1, 3.0, room=1)], targets={}, saturated={1}, now=later)
    assert lag.due(later + PERIOD) == 0.0  # past it: held by its room, its endpoint's pace


def test_the_rate_cut_from_is_the_one_the_claimed_jobs_were_published_at():
    """The jobs claimed now were published ``lag`` seconds ago: a burst that just ended was taken at
    its own rate, not at the lower one offered since (cutting from that refused at the rated load)."""
    gate = admission.LagAdmission()
    assert gate.taken_at(100.0) == 0.0  # nothing read yet
    gate._taken_history.extend([(10.0, 3000.0), (10.5, 2900.0), (11.0, 500.0)])
    assert gate.taken_at(11.2) == 500.0
    assert gate.taken_at(10.7) == 2900.0
    assert gate.taken_at(10.5) == 2900.0
    assert gate.taken_at(9.0) == 3000.0  # older than what is kept: the oldest kept
