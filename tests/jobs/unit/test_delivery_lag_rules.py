"""DB-free: admission by the push deliveries' lag. A dispatcher engine's figure (jobs.push.lag: the
shortest, across the consumers that count, of their longest wait from due to claimed, reported once
a period and only while it or the last report is not zero), and the share of publishes refused
from it (jobs.publish.admission.shed_share_next)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.publish.admission import BACKLOG, CATCHING_UP, SHARE_MAX, STEP, shed_share_next
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


@pytest.mark.parametrize("share, lag, growth, expected", [
    (0.0, 0.5, 5.0, 0.0),  # under the bound: nothing refused, however it moves
    (0.5, 0.0, 0.0, 0.5 - STEP),  # no lag reported (the broker keeps up): the share falls
    (0.5, 0.4, 0.0, 0.5 - STEP / 10),  # under it: the share eases off
    (0.0, 3.0, 0.0, STEP),  # over it and holding: the share rises
    (0.0, 1.5, 0.0, STEP / 2),  # ... by less while the lag is under twice the bound
    (0.2, 3.0, 2.0, 0.2 + 2 * STEP),  # over it and growing fast: faster
    (SHARE_MAX, 30.0, 5.0, SHARE_MAX),  # never every publish
    (0.6, 3.0, -2 * CATCHING_UP, 0.6),  # over it and catching up: holds
    (0.0, 3600.0, -0.05, 0.0),  # an old backlog drained (an endpoint back after an hour): nothing refused
    (0.0, 3600.0, 5.0, 0.0),  # ... even as the first of its hours-old jobs are claimed
    (0.3, BACKLOG + 1, 0.0, 0.3 - STEP),
])
def test_the_share_follows_the_lag(share, lag, growth, expected):
    assert shed_share_next(share=share, lag=lag, growth=growth, target=1.0) == pytest.approx(expected)


def test_off_refuses_nothing():
    assert shed_share_next(share=0.5, lag=100.0, growth=10.0, target=0.0) == 0.0


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
