"""DB-free: the push dispatcher's window (jobs.push.claim): a loop holds its next transaction for the
rest of the window unless a finished attempt belongs to a saturated consumer (its last claim took all
of its room), so a consumer held back by maxInFlight gets its room back at once."""

from __future__ import annotations

import pytest

from jobs.push.claim import PushJob, saturation_update, window_hold

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


def test_the_window_holds_unless_a_saturated_consumers_attempt_is_waiting():
    assert window_hold(last=10.0, window=0.02, now=10.005, saturated=set(), pending=[1]) == pytest.approx(0.015)
    assert window_hold(last=10.0, window=0.02, now=10.005, saturated={1}, pending=[2, 1]) == 0.0
    assert window_hold(last=10.0, window=0.02, now=10.05, saturated=set(), pending=[]) == 0.0  # window over
    assert window_hold(last=float("-inf"), window=0.02, now=10.0, saturated=set(), pending=[]) == 0.0  # quiet
