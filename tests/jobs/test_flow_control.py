"""Pause/resume a consumer and maxAckPending, over HTTP (pull endpoints and a real push receiver)."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from broker.xid import job_pk
from jobs.ops.dashboard import ConsumerStats, consumer_paused
from jobs.sweeps.inflight_timeout import jobs_expire_inflight

pytestmark = pytest.mark.django_db(transaction=True)

TOKENS = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"}


def update(api, url, data):
    """PUT an existing object (updates need If-Unmodified-Since)."""
    since = api.get(url)["Last-Modified"]
    return api.put(url, data, HTTP_IF_UNMODIFIED_SINCE=since)


def pull(batch=10, **extra):
    r = APIClient().post("/channel/ch1/consumer/c2/pull", {"batch": batch, **extra}, format="json", **TOKENS)
    assert r.status_code == 200, r.content
    return r.json()["Result"]


def ack(ids):
    r = APIClient().post("/channel/ch1/consumer/c2/ack",
                         {"Jobs": [{"ID": i, "NextState": "DELIVERED"} for i in ids]}, format="json", **TOKENS)
    assert r.status_code == 200, r.content


def test_pause_and_resume_pull_consumer(world, api):
    r = api.post("/channel/ch1/consumer/c2/pause")
    assert r.status_code == 200 and r.json()["Paused"] is True
    assert api.get("/channel/ch1/consumer/c2").json()["Paused"] is True
    for _ in range(3):
        assert world.publish().status_code == 201
    assert pull() == []
    started = time.monotonic()
    assert pull(expires=0.5) == []  # waits, then ends empty
    assert time.monotonic() - started >= 0.4
    assert api.get("/channel/ch1/consumer/c2").json()["NumPending"] == 3  # jobs accumulate
    r = api.post("/channel/ch1/consumer/c2/resume")
    assert r.status_code == 200 and r.json()["Paused"] is False
    assert len(pull()) == 3


def test_pause_requires_admin(world):
    assert APIClient().post("/channel/ch1/consumer/c2/pause").status_code == 401
    assert APIClient().post("/channel/ch1/consumer/c2/pause", HTTP_X_BROKER_ADMIN_TOKEN="x").status_code == 403
    assert APIClient().post("/channel/ch1/consumer/c2/pause", **TOKENS).status_code == 401
    from tests.conftest import ADMIN_TOKEN

    assert APIClient().post("/channel/ch1/consumer/nope/pause",
                            HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).status_code == 404


def test_dashboard_alert_for_paused_consumer(world, api):
    from consumers.models import Consumer

    api.post("/channel/ch1/consumer/c2/pause")
    c = Consumer.objects.get(consumer_id="c2")
    assert [a.kind for a in consumer_paused(ConsumerStats(consumer=c))] == ["paused"]
    api.post("/channel/ch1/consumer/c2/resume")
    c.refresh_from_db()
    assert list(consumer_paused(ConsumerStats(consumer=c))) == []


def test_paused_push_consumer_gets_nothing_until_resumed(push_world, receiver, dispatcher, api):
    assert api.post("/channel/ch1/consumer/c1/pause").status_code == 200
    dispatcher()
    for _ in range(3):
        assert push_world.publish().status_code == 201
    time.sleep(1.5)
    assert receiver.at("/cb") == []
    assert api.get("/channel/ch1/consumer/c1").json()["NumPending"] == 3
    api.post("/channel/ch1/consumer/c1/resume")
    receiver.wait(lambda: len(receiver.at("/cb")) >= 3, what="3 callbacks after resume")


def test_max_ack_pending_pull(world, api):
    r = update(api, "/channel/ch1/consumer/c2", {"type": "pull", "maxAckPending": 2})
    assert r.status_code == 200 and r.json()["MaxAckPending"] == 2, r.content
    assert api.get("/channel/ch1/consumer/c2").json()["MaxAckPending"] == 2
    for _ in range(5):
        world.publish()
    first = pull(batch=10)
    assert len(first) == 2
    assert pull() == []
    assert pull(expires=0.3) == []
    ack([first[0]["ID"]])
    again = pull()
    assert len(again) == 1
    assert pull() == []
    ack([first[1]["ID"], again[0]["ID"]])
    assert len(pull()) == 2


def test_max_ack_pending_default_and_timeout_redelivery(world, api, settings):
    assert api.get("/channel/ch1/consumer/c2").json()["MaxAckPending"] == 1000
    update(api, "/channel/ch1/consumer/c2", {"type": "pull", "maxAckPending": 1})
    world.publish()
    world.publish()
    [job] = pull(IncrementalTimeout=0)
    assert pull() == []
    # the lease runs out: the timeout sweep requeues it and it is redelivered despite the cap
    from jobs.models import Job

    Job.objects.filter(pk=job_pk(job["ID"])).update(deadline="2000-01-01T00:00:00Z")
    jobs_expire_inflight()
    got = pull()
    assert len(got) == 1 and got[0]["ID"] == job["ID"]


def test_max_ack_pending_push(push_world, receiver, dispatcher, api):
    from tests.jobs.conftest import Reply

    update(api, "/channel/ch1/consumer/c1", {"maxAckPending": 2, "maxInFlight": 10})
    receiver.behave("/cb", lambda n, req: Reply(delay=1.0))
    dispatcher()
    for _ in range(6):
        push_world.publish()
    receiver.wait(lambda: len(receiver.at("/cb")) >= 6, timeout=30, what="all 6 callbacks")
    assert receiver.max_active <= 2


def test_bad_max_ack_pending(world, api):
    r = update(api, "/channel/ch1/consumer/c2", {"type": "pull", "maxAckPending": 0})
    assert r.status_code == 400 and r.json()["error"] == "invalid_maxAckPending"
