"""Expiry (issue 17 part 3) over HTTP: X-Broker-Message-TTL, batch TTL, the channel's messageTTL,
their 400s; an expired job is never pulled or pushed (a real receiver), becomes DEAD with reason
``expired`` by the sweep (the dispatcher loop's), shows ``Reason`` in the DLQ and answers 409
``message_expired`` to a requeue; pulls racing the expiry never get an expired job."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from broker.xid import job_xid
from jobs.models import Job, JobStatus, JobTransition
from jobs.publish.scheduled import scheduled_dispatch_due
from jobs.push.claim import jobs_claim_push
from jobs.push.record import PushOutcome, jobs_push_record
from jobs.sweeps.message_expiry import jobs_expire_messages
from tests.jobs.conftest import json_of
from tests.jobs.pull.conftest import PullClient

pytestmark = pytest.mark.django_db(transaction=True)


def _batch(items, **headers):
    return APIClient().generic("POST", "/channel/ch1/messages", json.dumps(items), content_type="application/json",
                               HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                               HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)


def _ttl_of(message_id) -> float | None:
    """Seconds between receiving the message and its expiry (None: never expires); its jobs carry the same."""
    job = Job.objects.select_related("message").filter(message__message_id=message_id).first()
    m = job.message
    assert job.expires_at == m.expires_at
    return None if m.expires_at is None else (m.expires_at - m.received_at).total_seconds()


def _wait(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_ttl_header_batch_field_and_channel_default(world, api):
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="h", HTTP_X_BROKER_MESSAGE_TTL="90").status_code == 201
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="none").status_code == 201
    assert _ttl_of("h") == pytest.approx(90, abs=0.01) and _ttl_of("none") is None
    body = api.get("/channel/ch1/message/h").json()
    assert body["ExpiresAt"] and body["ExpiresAt"].endswith("Z")
    r = _batch([{"MessageID": "b1", "Payload": "x", "TTL": 30}, {"MessageID": "b2", "Payload": "y"}])
    assert r.status_code == 201
    assert _ttl_of("b1") == pytest.approx(30, abs=0.01) and _ttl_of("b2") is None
    r = _batch([{"MessageID": "b3", "Payload": "x", "TTL": 30}, {"MessageID": "b4", "Payload": "y"}],
               HTTP_X_BROKER_MESSAGE_TTL="45")  # the header for items without their own
    assert _ttl_of("b3") == pytest.approx(30, abs=0.01) and _ttl_of("b4") == pytest.approx(45, abs=0.01)
    # the channel's messageTTL: the default of messages without one
    since = api.get("/channel/ch1")["Last-Modified"]
    r = api.put("/channel/ch1", {"messageTTL": "600"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200 and r.json()["MessageTTL"] == 600
    assert api.get("/channel/ch1").json()["MessageTTL"] == 600
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="d").status_code == 201
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="o", HTTP_X_BROKER_MESSAGE_TTL="5").status_code == 201
    assert _batch([{"MessageID": "bd", "Payload": "x"}]).status_code == 201
    assert _ttl_of("d") == pytest.approx(600, abs=0.01) and _ttl_of("bd") == pytest.approx(600, abs=0.01)
    assert _ttl_of("o") == pytest.approx(5, abs=0.01)
    r = api.put("/channel/ch1", {"messageTTL": "none"}, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r.status_code == 200 and r.json()["MessageTTL"] is None


def test_ttl_400s(world, api):
    for bad in ("0", "-1", "31536001", "1.5", "abc", "1e3"):
        r = world.publish(HTTP_X_BROKER_MESSAGE_TTL=bad)
        assert r.status_code == 400, bad
        assert json_of(r)["error"] == "invalid_ttl" and json_of(r)["detail"]
    for bad in (0, 31_536_001, 1.5, True, "x", [1]):
        r = _batch([{"Payload": "x", "TTL": bad}])
        assert r.status_code == 400, bad
        assert json_of(r)["error"] == "invalid_ttl"
    since = api.get("/channel/ch1")["Last-Modified"]
    for bad in ("0", "31536001", "soon"):
        r = api.put("/channel/ch1", {"messageTTL": bad}, HTTP_IF_UNMODIFIED_SINCE=since)
        assert r.status_code == 400 and r.json()["error"] == "invalid_ttl", bad
    assert Job.objects.count() == 0
    assert world.publish(HTTP_X_BROKER_MESSAGE_TTL="31536000").status_code == 201  # the upper bound itself


def test_expired_job_is_never_pulled_and_dies_with_reason_expired(world, dispatcher, api):
    pc = PullClient(APIClient())
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="short", HTTP_X_BROKER_MESSAGE_TTL="1").status_code == 201
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="long").status_code == 201
    job = Job.objects.get(message__message_id="short", consumer__consumer_id="c2")
    time.sleep(max(0.0, (job.expires_at - _db_now()).total_seconds()) + 0.05)
    # before any sweep: listed and pulled jobs leave the expired one out
    assert [j["Message"]["MessageID"] for j in pc.queued().json()["Result"]] == ["long"]
    r = pc.set_state(job_xid(job.pk), {"NextState": "INFLIGHT"})  # the spec path cannot claim it either
    assert r.status_code == 409 and r.json()["error"] == "message_expired"
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
    pulled = pc.pull(batch=10).json()["Result"]
    assert [j["Message"]["MessageID"] for j in pulled] == ["long"]
    # the dispatcher loop's sweep (every second) moves it to DEAD: for the pull and the push consumer
    dispatcher()
    _wait(lambda: Job.objects.filter(message__message_id="short", status=JobStatus.DEAD).count() == 2,
          what="both jobs of the expired message DEAD")
    assert list(JobTransition.objects.filter(job_id=job.pk).values_list("from_status", "to_status", "reason")) == [
        (JobStatus.QUEUED, JobStatus.DEAD, "expired")]
    dlq = api.get("/channel/ch1/consumer/c2/dlq").json()["DeadJobs"]
    assert [(d["MessageID"], d["Reason"]) for d in dlq] == [("short", "expired")]
    # requeue: 409 message_expired, the job stays DEAD; the bulk requeue leaves it too
    r = pc.requeue(job_xid(job.pk))
    assert r.status_code == 409 and r.json()["error"] == "message_expired" and r.json()["detail"]
    r = APIClient().post("/channel/ch1/consumer/c2/dlq", {"requeue": "c2-token"})
    assert r.status_code == 202 and r.json()["requeuedCount"] == 0
    assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD
    # a dead job whose message has not expired still requeues (and its DLQ reason is the ack's)
    [long_job] = pulled
    assert pc.ack([{"ID": long_job["ID"], "NextState": "DEAD"}]).status_code == 200
    reasons = {d["MessageID"]: d["Reason"] for d in api.get("/channel/ch1/consumer/c2/dlq").json()["DeadJobs"]}
    assert reasons["short"] == "expired" and reasons["long"] not in ("", "expired")
    assert pc.requeue(long_job["ID"]).status_code == 202


def test_expired_push_jobs_are_never_sent(make, receiver, dispatcher, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"))
    assert api.post("/channel/ch1/consumer/c1/pause").status_code == 200
    for i in range(5):
        assert make.publish(HTTP_X_BROKER_MESSAGE_ID=f"e{i}", HTTP_X_BROKER_MESSAGE_TTL="1").status_code == 201
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="keep").status_code == 201
    time.sleep(1.1)
    # the push claim leaves expired jobs alone (no sweep has run: no dispatcher yet)
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 6
    assert api.post("/channel/ch1/consumer/c1/resume").status_code == 200
    claimed = jobs_claim_push(limit=100)
    assert [j.message_id for j in claimed] == ["keep"]
    jobs_push_record(outcomes=[PushOutcome(
        job_id=claimed[0].id, to_status=JobStatus.DELIVERED, attempt=1, age=0, duration_ms=1, status_code=204,
        excerpt="", error="", request_id="t", outcome="delivered")])
    assert jobs_expire_messages() == 5
    assert Job.objects.filter(status=JobStatus.DEAD).count() == 5
    dispatcher()
    time.sleep(1.5)
    assert receiver.at("/cb") == []  # nothing of the expired messages was ever sent


def _db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def test_pull_racing_expiry_never_returns_an_expired_job(world):
    """Pulls hammer the consumer across the moment its messages expire, while a sweeper thread runs:
    every claim happened before the job's expiry (the claim and the expiry are compared on the
    database clock), and once expired nothing is handed out. Repeated a few times."""
    stop = threading.Event()

    def sweeper():
        try:
            while not stop.is_set():
                jobs_expire_messages()
                time.sleep(0.01)
        finally:
            connection.close()

    totals = {"claimed": 0, "expired": 0}
    thread = threading.Thread(target=sweeper, daemon=True)
    thread.start()
    try:
        pc = PullClient(APIClient())
        for rnd in range(4):
            # one batch: all 30 messages expire at the same instant
            r = _batch([{"MessageID": f"r{rnd}-{i}", "Payload": "x", "TTL": 1} for i in range(30)])
            assert r.status_code == 201
            first = Job.objects.filter(consumer__consumer_id="c2", message__message_id=f"r{rnd}-0").get()
            # start pulling just before the expiry (a little earlier each round); one job per pull,
            # until well after it
            time.sleep(max(0.0, (first.expires_at - _db_now()).total_seconds() - 0.01 * (rnd + 1)))
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                r = pc.pull(batch=1)
                assert r.status_code == 200
            after = pc.pull(batch=100).json()["Result"]
            assert after == []
            claims = JobTransition.objects.filter(
                job_id__in=Job.objects.filter(message__message_id__startswith=f"r{rnd}-", consumer__consumer_id="c2")
                .values("pk"), to_status=JobStatus.INFLIGHT)
            expires = dict(Job.objects.filter(message__message_id__startswith=f"r{rnd}-",
                                              consumer__consumer_id="c2").values_list("pk", "expires_at"))
            for t in claims:
                assert t.at < expires[t.job_id], (rnd, t.job_id, t.at, expires[t.job_id])
            # everything not claimed in time is (or becomes) DEAD with reason expired
            _wait(lambda: not Job.objects.filter(consumer__consumer_id="c2", status=JobStatus.QUEUED,
                                                 message__message_id__startswith=f"r{rnd}-").exists(),
                  what="the expired jobs swept")
            n_claimed = claims.count()
            n_expired = JobTransition.objects.filter(job_id__in=list(expires), reason="expired").count()
            assert n_claimed + n_expired == 30
            totals["claimed"] += n_claimed
            totals["expired"] += n_expired
            # jobs claimed in time finish as usual: ack them
            held = Job.objects.filter(pk__in=list(expires), status=JobStatus.INFLIGHT)
            if held:
                r = pc.ack([{"ID": job_xid(j.pk), "NextState": "DELIVERED"} for j in held])
                assert r.status_code == 200
    finally:
        stop.set()
        thread.join(5)
    print("race totals", totals)
    assert totals["expired"] > 0  # the pulls did run into the expiry
    assert Job.objects.filter(consumer__consumer_id="c2", status=JobStatus.DEAD).exclude(
        pk__in=JobTransition.objects.filter(reason="expired").values("job_id")).count() == 0


def test_scheduled_message_keeps_type_and_ttl(world, api, push_settings):
    """Type and TTL travel with a scheduled message; its TTL counts from publication."""
    since = api.get("/channel/ch1/consumer/c2")["Last-Modified"]
    r = api.put("/channel/ch1/consumer/c2", {"messageTypes": "user.*"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200
    at = (_db_now() + timedelta(seconds=2.5)).isoformat()  # BROKER_MIN_SCHEDULE_DELAY is 1 s here
    r = world.publish(HTTP_X_BROKER_MESSAGE_ID="later", HTTP_X_BROKER_SCHEDULED_FOR=at,
                      HTTP_X_BROKER_MESSAGE_TYPE="order.created", HTTP_X_BROKER_MESSAGE_TTL="60")
    assert r.status_code == 201, r.content
    time.sleep(2.7)
    assert scheduled_dispatch_due() == 1
    assert [c for c, in Job.objects.filter(message__message_id="later").values_list("consumer__consumer_id")] == ["c1"]
    assert api.get("/channel/ch1/message/later").json()["Type"] == "order.created"
    assert _ttl_of("later") == pytest.approx(60, abs=0.01)
