"""DB-free: the push dispatcher's window (jobs.push.claim): a loop holds its next transaction for the
rest of the window unless a finished delivery belongs to a saturated consumer (its last claim took all
of its room), so a consumer held back by maxInFlight gets its room back at once; and a loop's fair
shares of its callbacks among consumers (``fair_share``, ``fair_caps``)."""

from __future__ import annotations

import pytest

from jobs.push.claim import PushJob, fair_caps, fair_share, saturation_update, window_hold

pytestmark = pytest.mark.unit


def job(consumer: int, room: int | None) -> PushJob:
    return PushJob(id=1, consumer_pk=consumer, priority=0, retry_count=0, message_id="m", payload=b"",
                   content_type="", headers={}, consumer_updated_at=None, room=room)


def test_a_claim_that_took_all_of_a_consumers_room_saturates_it_and_a_partial_one_clears_it():
    saturated: set[int] = {9}
    saturation_update(saturated, [job(1, 2), job(1, 2), job(2, 5), job(3, None)])
    assert saturated == {1, 9}  # 1 filled its room; 2 took 1 of 5; 9 had no job in the claim: unchanged
    saturation_update(saturated, [job(1, 3), job(9, 4)])
    assert saturated == set()


def test_the_window_holds_unless_half_of_a_saturated_consumers_room_is_back():
    def hold(**kw):
        return window_hold(**{"last": 10.0, "window": 0.02, "now": 10.005, "saturated": set(), "delivered": {},
                              "inflight": {}, **kw})

    assert hold(delivered={1: 1}) == pytest.approx(0.015)  # not saturated: the rest of the window
    assert hold(saturated={1}, delivered={2: 1, 1: 1}) == 0.0  # its only callback is back: at once
    assert hold(saturated={1}, delivered={1: 5}, inflight={1: 5}) == 0.0  # half of them back: at once
    assert hold(saturated={1}, delivered={1: 2}, inflight={1: 8}) == pytest.approx(0.005)  # look again soon
    assert hold(now=10.05) == 0.0  # window over
    assert hold(last=float("-inf")) == 0.0  # quiet
    # a saturated consumer's failed attempts (not in ``delivered``) wait for the window like any other
    assert hold(saturated={1}) == pytest.approx(0.015)


def test_a_fair_share_leaves_room_for_one_more_consumer_or_half_of_what_is_free():
    assert fair_share(inflight={}, size=256) == 256
    assert fair_share(inflight={1: 128}, size=256) == 128  # alone: half, the rest for the next one
    assert fair_share(inflight={1: 128, 2: 5}, size=256) == 85  # two with callbacks in flight, one more
    assert fair_share(inflight={1: 10, 2: 5}, size=256) == 120  # mostly free: half of the free room
    assert fair_share(inflight={i: 1 for i in range(1000)}, size=256) == 1  # never below one


def test_fair_caps_hold_a_consumer_at_its_share_and_a_claim_to_half_of_what_is_free():
    caps = fair_caps(inflight={1: 85, 2: 5, 3: 0}, size=256, limit=200)
    assert caps.limit == 83  # (256 - 90) // 2: all that this claim may take
    assert dict(zip(caps.consumers, caps.caps)) == {1: 0, 2: 80}  # 1 is at its share (85): nothing more
    assert fair_caps(inflight={}, size=256, limit=200).limit == 128  # a first consumer: half the loop
    caps = fair_caps(inflight={1: 3}, size=256, limit=20)
    assert (caps.limit, caps.consumers, caps.caps) == (20, [], [])  # room above the limit: not listed
    assert fair_caps(inflight={1: 255}, size=256, limit=200).limit == 1  # never none
