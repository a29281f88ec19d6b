"""The timeout sweep (jobs.sweeps.inflight_timeout): an in-flight job past its deadline goes back to
QUEUED with a retry, DEAD past the retry limit; IncrementalTimeout extends the lease; a late outcome
before the sweep still counts; the sweep's batches and budget."""

from __future__ import annotations

import time
from functools import partial

import pytest

from jobs.state.transitions import DEAD, INFLIGHT, QUEUED
from jobs.sweeps.inflight_timeout import consumer_sweep, jobs_expire_inflight
from tests import processes
from tests.jobs.moves import Move, jobs_move
from tests.jobs.pull.conftest import claim_one, job_status, publish_n

pytestmark = pytest.mark.django_db


@pytest.fixture
def short_timeouts(settings):
    """stopTimeout 0.5 s (0.25 + 0.25) and rationalDelay 0.25 s: a claim lasts 0.75 s + IncrementalTimeout."""
    settings.BROKER_CONNECTION_TIMEOUT = 0.25
    settings.BROKER_RATIONAL_DELAY = 0.25
    return settings


wait_for = partial(processes.wait_for, timeout=10.0, interval=0.05)


@pytest.mark.django_db(transaction=True)  # now() must move: no wrapping test transaction
def test_inflight_job_times_out_back_to_queued_then_dead(world, pc, api, short_timeouts):
    api.put("/channel/ch1/consumer/c2", {"maxRetry": 2}, HTTP_IF_UNMODIFIED_SINCE=api.get(
        "/channel/ch1/consumer/c2").headers["Last-Modified"])
    publish_n(world, 1)
    jid = claim_one(pc)
    assert jobs_expire_inflight() == 0 and job_status(jid) == ("INFLIGHT", 0)
    time.sleep(0.8)
    # the GET sweeps an expired lease of its consumer before answering
    assert pc.job(jid).json()["Status"] == "QUEUED"
    assert job_status(jid) == ("QUEUED", 1)
    for retry in (2, 3):
        assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202
        time.sleep(0.8)
        assert wait_for(lambda: jobs_expire_inflight() or job_status(jid)[0] != "INFLIGHT")
        assert job_status(jid) == ("QUEUED" if retry <= 2 else "DEAD", retry)
    assert pc.job(jid).json()["JobRequeueURL"].endswith(f"/job/{jid}/requeue-dead-job")


@pytest.mark.django_db(transaction=True)  # now() must move: no wrapping test transaction
def test_incremental_timeout_extends_the_lease(world, pc, short_timeouts):
    publish_n(world, 1)
    jid = claim_one(pc, IncrementalTimeout=2)
    time.sleep(1.0)
    jobs_expire_inflight()
    assert job_status(jid) == ("INFLIGHT", 0)  # 0.75 s passed the base timeout, not the 2.75 s lease
    assert wait_for(lambda: pc.job(jid).json()["Status"] == "QUEUED", timeout=6)
    assert job_status(jid) == ("QUEUED", 1)


@pytest.mark.django_db(transaction=True)  # now() must move: no wrapping test transaction
def test_timed_out_job_shows_up_again_in_queued_jobs(world, pc, short_timeouts):
    publish_n(world, 1)
    jid = claim_one(pc)
    assert pc.queued().json()["Result"] == []
    # queued-jobs sweeps its consumer lazily (at most once a second per process)
    got = wait_for(lambda: pc.queued().json()["Result"], timeout=5, interval=0.2)
    assert [j["ID"] for j in got] == [jid]


@pytest.mark.django_db(transaction=True)  # now() must move: no wrapping test transaction
def test_late_delivery_before_the_sweep_is_accepted(world, pc, short_timeouts):
    """Until the sweep moves it, an expired job is still INFLIGHT and held by nobody else."""
    publish_n(world, 1)
    jid = claim_one(pc)
    time.sleep(0.8)
    assert pc.set_state(jid, {"NextState": "DELIVERED"}).status_code == 202
    assert jobs_expire_inflight() == 0 and job_status(jid) == ("DELIVERED", 0)


# --- the sweep itself ----------------------------------------------------------------------------------

def _expired_inflight(consumer: str, n: int) -> list[int]:
    """n of the consumer's QUEUED jobs moved to INFLIGHT with a deadline already passed."""
    from jobs.models import Job

    ids = list(Job.objects.filter(consumer__consumer_id=consumer, status=QUEUED).order_by("pk")
               .values_list("pk", flat=True)[:n])
    moved = jobs_move(moves=[Move(job_id=i, from_status=QUEUED, to_status=INFLIGHT, timeout=-1.0) for i in ids],
                      reason="test")
    assert len(moved) == n
    return ids


def _statuses(ids) -> dict[int, tuple[int, int]]:
    from jobs.models import Job

    return {pk: (status, retry) for pk, status, retry in
            Job.objects.filter(pk__in=ids).values_list("pk", "status", "retry_count")}


def test_the_sweep_requeues_every_expired_job_in_batches_with_a_retry(world, make):
    make.consumer("c3", type="pull", callback=None)
    publish_n(world, 7)
    ids = _expired_inflight("c2", 7) + _expired_inflight("c3", 7)
    assert jobs_expire_inflight(limit=3) == 14  # batches of 3 until one comes back short
    assert set(_statuses(ids).values()) == {(QUEUED, 1)}
    assert jobs_expire_inflight(limit=3) == 0  # nothing left: one empty batch


def test_a_consumer_sweep_moves_only_that_consumers_jobs(world, make):
    from consumers.models import Consumer

    make.consumer("c3", type="pull", callback=None)
    publish_n(world, 2)
    mine, theirs = _expired_inflight("c2", 2), _expired_inflight("c3", 2)
    c2 = Consumer.objects.get(consumer_id="c2").pk
    assert jobs_expire_inflight(consumer_pk=c2) == 2
    assert set(_statuses(mine).values()) == {(QUEUED, 1)}
    assert set(_statuses(theirs).values()) == {(INFLIGHT, 0)}


def test_past_the_consumers_retry_limit_the_sweep_kills_the_job(world, make):
    make.consumer("c3", type="pull", callback=None, maxRetry="0")
    publish_n(world, 1)
    ids = _expired_inflight("c3", 1)
    assert jobs_expire_inflight() == 1
    assert _statuses(ids)[ids[0]] == (DEAD, 1)


def test_the_lazy_consumer_sweep_runs_at_most_once_a_second_per_process(world):
    from consumers.models import Consumer

    publish_n(world, 2)
    c2 = Consumer.objects.get(consumer_id="c2").pk
    first = _expired_inflight("c2", 1)
    assert consumer_sweep(consumer_pk=c2, force=True) == 1  # sweeps now and starts this process's second
    assert _statuses(first)[first[0]][0] == QUEUED
    second = _expired_inflight("c2", 1)
    assert consumer_sweep(consumer_pk=c2) == 0  # within the second: skipped, the job stays expired
    assert _statuses(second)[second[0]][0] == INFLIGHT
    assert consumer_sweep(consumer_pk=c2, force=True) == 1  # a forced sweep (a job URL past its deadline)
