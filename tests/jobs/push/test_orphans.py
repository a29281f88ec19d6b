"""Orphaned push claims (issue 38 item 10): whatever ends a dispatcher's process, its in-flight
jobs go back to QUEUED at the next housekeeping run anywhere, not at their deadline; an alive
dispatcher's claims (even a hung one's) are left to the deadline; claims of an older release (no
owner) wait while a dispatcher of that release is still connected."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from broker.db.listen import dedicated_connect
from jobs.models import Job, JobStatus, JobTransition, PushOwner
from jobs.push.claim import jobs_claim_push
from jobs.push.owners import owner_id_new, push_owner_register
from jobs.sweeps import orphans
from jobs.sweeps.orphans import jobs_requeue_orphans
from tests.jobs.conftest import Reply
from tests.processes import start_qcluster, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def statuses():
    return sorted(Job.objects.values_list("status", flat=True))


@pytest.fixture
def legacy_pending(monkeypatch):
    """This process has not yet swept the ownerless claims (each test starts as a new cluster)."""
    monkeypatch.setitem(orphans._legacy, "done", False)


def _owner(application_name="broker-push-listen"):
    """A live engine's owner row on its own connection (as the dispatcher's listener registers)."""
    conn = dedicated_connect(application_name=application_name)
    owner = owner_id_new()
    push_owner_register(conn=conn, owner_id=owner)
    return conn, owner


def test_claims_of_a_gone_dispatcher_are_queued_again_at_once(push_world, legacy_pending):
    for _ in range(3):
        push_world.publish()
    conn, owner = _owner()
    assert len(jobs_claim_push(limit=10, owner=owner)) == 3
    assert jobs_requeue_orphans() == 0  # alive: its claims are its own
    assert statuses() == [JobStatus.INFLIGHT] * 3 and PushOwner.objects.filter(pk=owner).exists()
    conn.close()  # the process is gone (its backend ends with it)
    assert wait_for(lambda: jobs_requeue_orphans() == 3 or statuses() == [JobStatus.QUEUED] * 3, timeout=10)
    assert statuses() == [JobStatus.QUEUED] * 3
    assert set(Job.objects.values_list("retry_count", flat=True)) == {0}  # no retry spent
    assert JobTransition.objects.filter(reason="orphaned").count() == 3
    assert not PushOwner.objects.filter(pk=owner).exists()
    assert jobs_requeue_orphans() == 0


def test_a_hung_but_alive_dispatcher_keeps_its_claims_until_their_deadline(push_world, legacy_pending):
    push_world.publish()
    conn, owner = _owner()
    try:
        assert len(jobs_claim_push(limit=10, owner=owner)) == 1
        for _ in range(3):
            assert jobs_requeue_orphans() == 0
        assert statuses() == [JobStatus.INFLIGHT]
    finally:
        conn.close()


def test_ownerless_claims_wait_for_the_older_release_dispatchers_to_go(push_world, legacy_pending):
    """A rolling upgrade: the previous release's claims carry no owner; they are orphans only once
    no unregistered push listener (that release's dispatcher) is connected."""
    make = push_world
    make.consumer("pull1", type="pull", token="pull-token", callback=None)
    for _ in range(2):
        make.publish()
    old = dedicated_connect(application_name="broker-push-listen")  # an old release's dispatcher: no owner row
    assert len(jobs_claim_push(limit=10)) == 2  # its claims (claimed_by NULL)
    # a pull claim has no owner either, and is never an orphan
    Job.objects.filter(consumer__consumer_id="pull1").update(status=JobStatus.INFLIGHT)
    assert jobs_requeue_orphans() == 0 and not orphans._legacy["done"]
    old.close()
    assert wait_for(lambda: jobs_requeue_orphans() == 2 or orphans._legacy["done"], timeout=10)
    assert orphans._legacy["done"]
    assert sorted(Job.objects.filter(consumer__consumer_id="c1").values_list("status", flat=True)) == \
        [JobStatus.QUEUED] * 2
    assert list(Job.objects.filter(consumer__consumer_id="pull1").values_list("status", flat=True)) == \
        [JobStatus.INFLIGHT] * 2


def test_a_killed_cluster_s_room_is_taken_by_the_next_within_seconds(tmp_path, make, receiver, dispatcher,
                                                                    push_settings):
    """A real qcluster claims every job of a maxInFlight 3 consumer against a callback that hangs,
    then is SIGKILLed with its whole group (as systemd's KillMode ends what outlives the grace): the
    next cluster (a dispatcher here) delivers them within seconds, although their deadline is a
    minute away."""
    make.basics().consumer("c1", callback=receiver.url("/cb"), maxInFlight="3")
    hang = {"on": True}
    receiver.behave("/cb", lambda n, r: Reply(204, delay=60.0) if hang["on"] else Reply(204))
    for _ in range(3):
        make.publish()
    old = start_qcluster(tmp_path, BROKER_CONNECTION_TIMEOUT="60", BROKER_Q_WORKERS="2")
    try:
        assert wait_for(lambda: len(receiver.at("/cb")) >= 3, timeout=60), old.output()[-3000:]
        assert statuses() == [JobStatus.INFLIGHT] * 3
        assert set(Job.objects.values_list("claimed_by", flat=True)) - {None}, "claims name their owner"
    finally:
        old.kill()  # SIGKILL to the whole group: no clean-up of any kind
        old.popen.wait(timeout=10)
    gone = time.monotonic()
    hang["on"] = False
    dispatcher()
    assert wait_for(lambda: statuses() == [JobStatus.DELIVERED] * 3, timeout=30)
    took = time.monotonic() - gone
    assert took < 20, f"delivered {took:.1f} s after the kill: the deadline (60 s), not the owner check"
    assert JobTransition.objects.filter(reason="orphaned").count() == 3
    assert JobTransition.objects.filter(reason="timeout").count() == 0
    connection.close()
