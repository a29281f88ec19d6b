"""Push delivery against real HTTP receivers on 127.0.0.1: headers and signatures, outcomes,
retries and backoff, Retry-After, 410, limits, priority, crash recovery."""

from __future__ import annotations

import socket
import time

import pytest
from standardwebhooks import Webhook

from broker.xid import job_xid
from jobs.models import DeliveryAttempt, Job, JobStatus, JobTransition
from broker.db.listen import dedicated_connect
from jobs.push.claim import jobs_claim_push
from jobs.push.owners import owner_id_new, push_owner_register
from tests.jobs.conftest import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(consumer_id="c1"):
    return sorted(Job.objects.filter(consumer__consumer_id=consumer_id).values_list("status", flat=True))


def wait_status(receiver, status, n, consumer_id="c1", timeout=20.0):
    receiver.wait(lambda: Job.objects.filter(consumer__consumer_id=consumer_id, status=status).count() == n,
                  timeout=timeout, what=f"{n} jobs of {consumer_id} in {JobStatus(status).name}")


def test_callback_carries_payload_headers_and_verifiable_signature(push_world, receiver, dispatcher, api):
    secret = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    dispatcher()
    r = push_world.publish(body=b'{"order": 42}', HTTP_X_BROKER_MESSAGE_ID="m-1", HTTP_X_BROKER_MESSAGE_PRIORITY="3",
                           HTTP_X_BROKER_METADATA_HEADERS="X-Trace-Id", HTTP_X_TRACE_ID="trace-7")
    assert r.status_code == 201
    [got] = receiver.wait(lambda: receiver.at("/cb"), what="the callback")
    assert got.body == b'{"order": 42}'
    h = got.headers
    assert h["content-type"] == "application/json"
    assert h["x-broker-message-id"] == "m-1"
    assert h["x-broker-channel-id"] == "ch1"
    assert h["x-broker-consumer-id"] == "c1"
    assert h["x-broker-consumer-token"] == "c-token"
    assert h["x-broker-message-priority"] == "3"
    assert h["user-agent"] == "Webhook Message Broker"
    assert h["x-trace-id"] == "trace-7" and h["x-broker-metadata-headers"] == "X-Trace-Id"
    assert len(h["x-request-id"]) >= 16
    job = Job.objects.get(consumer__consumer_id="c1")
    assert h["webhook-id"] == job_xid(job.pk)
    # a receiver using the standardwebhooks package verifies the signature
    assert Webhook(secret).verify(got.body, got.headers) == {"order": 42}
    wait_status(receiver, JobStatus.DELIVERED, 1)
    attempt = DeliveryAttempt.objects.get(job_id=job.pk)
    assert (attempt.status_code, attempt.outcome, attempt.attempt) == (204, "delivered", 1)
    assert attempt.request_id == h["x-request-id"] and attempt.duration_ms >= 0
    assert list(JobTransition.objects.filter(job_id=job.pk).order_by("id").values_list("to_status", flat=True)) == [
        JobStatus.INFLIGHT, JobStatus.DELIVERED]


def test_token_header_and_user_agent_are_configurable(push_world, receiver, dispatcher, settings):
    settings.BROKER_CONSUMER_TOKEN_HEADER = "X-Hook-Token"
    settings.BROKER_USER_AGENT = "my-broker/1"
    dispatcher()
    push_world.publish()
    [got] = receiver.wait(lambda: receiver.at("/cb"))
    assert got.headers["x-hook-token"] == "c-token" and "x-broker-consumer-token" not in got.headers
    assert got.headers["user-agent"] == "my-broker/1"


def test_metadata_headers_cannot_replace_broker_headers(push_world, receiver, dispatcher):
    dispatcher()
    push_world.publish(HTTP_X_BROKER_METADATA_HEADERS="webhook-signature,X-Broker-Consumer-Token,X-Ok",
                       HTTP_WEBHOOK_SIGNATURE="v1,forged", HTTP_X_OK="yes")
    [got] = receiver.wait(lambda: receiver.at("/cb"))
    assert got.headers["webhook-signature"] != "v1,forged"
    assert got.headers["x-broker-consumer-token"] == "c-token" and got.headers["x-ok"] == "yes"


def test_keep_alive_connections_are_reused(push_world, receiver, dispatcher):
    dispatcher(concurrency=1)
    for _ in range(5):
        assert push_world.publish().status_code == 201
    receiver.wait(lambda: len(receiver.at("/cb")) == 5)
    assert len({r.client_port for r in receiver.at("/cb")}) == 1


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_every_failure_class_is_recorded_and_retried_until_dead(make, receiver, dispatcher):
    make.channel()
    make.producer()
    receiver.behave("/500", lambda n, r: Reply(500, body=b"boom" * 1000))
    receiver.behave("/slow", lambda n, r: Reply(204, delay=1.5))
    receiver.behave("/redirect", lambda n, r: Reply(302, headers={"Location": "http://example.invalid/"}))
    make.consumer("e500", callback=receiver.url("/500"), maxRetry="1", retryBackoff="0.2")
    make.consumer("slow", callback=receiver.url("/slow"), maxRetry="1", retryBackoff="0.2", connectionTimeout="0.5")
    make.consumer("redir", callback=receiver.url("/redirect"), maxRetry="1", retryBackoff="0.2")
    make.consumer("refused", callback=f"http://127.0.0.1:{_closed_port()}/cb", maxRetry="1", retryBackoff="0.2")
    dispatcher()
    assert make.publish().status_code == 201
    for cid in ("e500", "slow", "redir", "refused"):
        wait_status(receiver, JobStatus.DEAD, 1, consumer_id=cid)
    attempts = {}
    for a in DeliveryAttempt.objects.order_by("id"):
        cid = Job.objects.get(pk=a.job_id).consumer.consumer_id
        attempts.setdefault(cid, []).append(a)
    assert {cid: len(a) for cid, a in attempts.items()} == {"e500": 2, "slow": 2, "redir": 2, "refused": 2}
    first = attempts["e500"][0]
    assert first.status_code == 500 and first.outcome == "failed"
    assert first.response_excerpt.startswith("boom") and len(first.response_excerpt) == 1024  # bounded excerpt
    assert attempts["slow"][0].status_code is None and attempts["slow"][0].outcome == "timeout"
    assert "timeout" in attempts["slow"][0].error
    assert attempts["redir"][0].status_code == 302 and "not followed" in attempts["redir"][0].error
    assert attempts["refused"][0].status_code is None and attempts["refused"][0].outcome == "error"
    assert "Connection" in attempts["refused"][0].error
    assert [a.attempt for a in attempts["refused"]] == [1, 2]
    assert len(receiver.at("/redirect")) == 2  # never followed to example.invalid


def test_backoff_timing_follows_the_configured_steps(push_world, receiver, dispatcher, push_settings):
    push_settings.BROKER_RETRY_BACKOFF = [0.4, 0.8]
    receiver.behave("/cb", lambda n, r: Reply(503 if n <= 3 else 204))
    dispatcher()
    push_world.publish()
    wait_status(receiver, JobStatus.DELIVERED, 1)
    times = [r.at for r in receiver.at("/cb")]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # steps 0.4, 0.8, then linear by the last step: 2 x 0.8 (plus up to 10% jitter)
    for gap, step in zip(gaps, [0.4, 0.8, 1.6]):
        assert step <= gap < step + 2.0, (gaps, step)
    job = Job.objects.get()
    assert job.retry_count == 3 and job.status == JobStatus.DELIVERED
    assert [a.attempt for a in DeliveryAttempt.objects.order_by("id")] == [1, 2, 3, 4]


def test_dead_after_max_retry_and_listed_in_the_dlq(push_world, receiver, dispatcher, push_settings, api):
    push_settings.BROKER_MAX_RETRY = 2
    push_settings.BROKER_RETRY_BACKOFF = [0.2]
    receiver.behave("/cb", lambda n, r: Reply(500))
    dispatcher()
    push_world.publish(HTTP_X_BROKER_MESSAGE_ID="doomed")
    wait_status(receiver, JobStatus.DEAD, 1)
    assert len(receiver.at("/cb")) == 3  # 1 + max retry
    time.sleep(0.5)
    assert len(receiver.at("/cb")) == 3
    dlq = api.get("/channel/ch1/consumer/c1/dlq").json()
    [dead] = dlq["DeadJobs"]
    assert dead["Status"] == "DEAD" and dead["MessageURL"] == "/channel/ch1/message/doomed"


def test_retry_after_is_honoured(push_world, receiver, dispatcher, push_settings):
    push_settings.BROKER_RETRY_BACKOFF = [0.1]
    receiver.behave("/cb", lambda n, r: Reply(429, headers={"Retry-After": "2"}) if n == 1 else Reply(200))
    dispatcher()
    push_world.publish()
    wait_status(receiver, JobStatus.DELIVERED, 1)
    first, second = receiver.at("/cb")
    assert 2.0 <= second.at - first.at < 5.0


def test_410_gone_is_dead_at_once(push_world, receiver, dispatcher):
    receiver.behave("/cb", lambda n, r: Reply(410))
    dispatcher()
    push_world.publish()
    wait_status(receiver, JobStatus.DEAD, 1)
    time.sleep(1.0)
    assert len(receiver.at("/cb")) == 1
    assert DeliveryAttempt.objects.get().outcome == "gone"
    assert Job.objects.get().retry_count == 0


def test_rotated_secret_sends_both_signatures(push_world, receiver, dispatcher, api):
    old = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    r = api.post("/channel/ch1/consumer/c1/rotate-secret")
    assert r.status_code == 200
    new = r.json()["SigningSecret"]
    assert new.startswith("whsec_") and new != old
    dispatcher()
    push_world.publish(body=b'{"a": 1}')
    [got] = receiver.wait(lambda: receiver.at("/cb"))
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert Webhook(new).verify(got.body, got.headers) == {"a": 1}
    assert Webhook(old).verify(got.body, got.headers) == {"a": 1}


def test_rotation_grace_zero_sends_only_the_new_signature(push_world, receiver, dispatcher, api):
    old = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    new = api.post("/channel/ch1/consumer/c1/rotate-secret", {"graceSeconds": "0"}).json()["SigningSecret"]
    dispatcher()
    push_world.publish(body=b"plain text", content_type="text/plain")
    [got] = receiver.wait(lambda: receiver.at("/cb"))
    assert Webhook(new).verify(got.body, got.headers, json_parse=False) is None
    with pytest.raises(Exception):
        Webhook(old).verify(got.body, got.headers, json_parse=False)


def test_signing_secret_from_the_consumer_put(make, receiver, dispatcher):
    make.channel()
    make.producer()
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = make.consumer("c1", callback=receiver.url("/cb"), signingSecret=secret)
    assert body["SigningSecret"] == secret
    dispatcher()
    make.publish(body=b'{"x": true}')
    [got] = receiver.wait(lambda: receiver.at("/cb"))
    assert Webhook(secret).verify(got.body, got.headers) == {"x": True}


def test_max_in_flight_holds_across_dispatcher_processes(make, receiver, dispatcher):
    make.channel()
    make.producer()
    receiver.behave("/cb", lambda n, r: Reply(204, delay=0.2))
    make.consumer("c1", callback=receiver.url("/cb"), maxInFlight="3")
    dispatcher()
    dispatcher()  # two loops with their own threads, like two worker processes
    for _ in range(15):
        make.publish()
    wait_status(receiver, JobStatus.DELIVERED, 15)
    assert receiver.max_active <= 3
    assert receiver.max_active >= 2  # and it does deliver in parallel


def test_max_deliveries_per_second_paces_callbacks(make, receiver, dispatcher):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), maxDeliveriesPerSecond="5")
    for _ in range(8):
        make.publish()
    dispatcher()
    dispatcher()
    wait_status(receiver, JobStatus.DELIVERED, 8)
    times = sorted(r.at for r in receiver.at("/cb"))
    assert times[-1] - times[0] >= 7 / 5 - 0.2  # 8 callbacks at 5/s span ~1.4 s


def test_priority_first_then_oldest_across_consumers(make, receiver, dispatcher):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), maxInFlight="1")
    for mid, prio in [("a", 0), ("b", 5), ("c", 0), ("d", 9), ("e", 5)]:
        make.publish(HTTP_X_BROKER_MESSAGE_ID=mid, HTTP_X_BROKER_MESSAGE_PRIORITY=str(prio))
    dispatcher()
    receiver.wait(lambda: len(receiver.at("/cb")) == 5)
    assert [r.headers["x-broker-message-id"] for r in receiver.at("/cb")] == ["d", "b", "e", "a", "c"]


def test_pull_consumers_jobs_are_never_pushed(make, receiver, dispatcher):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"))
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    dispatcher()
    make.publish()
    wait_status(receiver, JobStatus.DELIVERED, 1)
    time.sleep(0.5)
    assert statuses("c2") == [JobStatus.QUEUED]
    assert len(receiver.at("/cb")) == 1


def test_job_left_in_flight_by_a_hung_worker_is_delivered_after_its_deadline(push_world, receiver, dispatcher,
                                                                             push_settings):
    """A worker that claims and then hangs (its process alive: tests/jobs/push/test_orphans.py has the
    one that dies) holds its jobs until their deadline; then they are delivered."""
    push_settings.BROKER_CONNECTION_TIMEOUT = 0.5
    for _ in range(3):
        push_world.publish()
    hung = dedicated_connect(application_name="broker-push-listen")
    owner = owner_id_new()
    push_owner_register(conn=hung, owner_id=owner)
    try:
        claimed = jobs_claim_push(limit=10, owner=owner)  # a worker claims, then hangs before posting
        assert len(claimed) == 3 and statuses() == [JobStatus.INFLIGHT] * 3
        dispatcher()
        wait_status(receiver, JobStatus.DELIVERED, 3, timeout=15)
    finally:
        hung.close()
    assert all(j.retry_count == 1 for j in Job.objects.all())
    assert JobTransition.objects.filter(reason="timeout").count() == 3


def test_publish_wakes_the_dispatcher_without_waiting_for_the_poll(push_world, receiver, dispatcher, push_settings):
    push_settings.BROKER_PUSH_POLL = 30.0
    dispatcher()
    time.sleep(0.5)  # let the first poll pass
    start = time.monotonic()
    push_world.publish()
    [got] = receiver.wait(lambda: receiver.at("/cb"), timeout=10)
    assert got.at - start < 5.0  # far below the 30 s poll: woken by NOTIFY


def test_requeue_from_the_dlq_delivers_again(push_world, receiver, dispatcher, push_settings):
    push_settings.BROKER_MAX_RETRY = 0
    healthy = {"yes": False}
    receiver.behave("/cb", lambda n, r: Reply(204 if healthy["yes"] else 500))
    dispatcher()
    for i in range(3):
        push_world.publish(HTTP_X_BROKER_MESSAGE_ID=f"r{i}")
    wait_status(receiver, JobStatus.DEAD, 3)
    healthy["yes"] = True
    from rest_framework.test import APIClient

    r = APIClient().post("/channel/ch1/consumer/c1/dlq", {"requeue": "c-token"})
    assert r.status_code == 202 and r.json()["requeuedCount"] == 3
    wait_status(receiver, JobStatus.DELIVERED, 3)
    assert len(receiver.at("/cb")) == 6


def test_scheduled_message_is_pushed_when_due(push_world, receiver, dispatcher):
    from datetime import datetime, timedelta, timezone

    when = (datetime.now(timezone.utc) + timedelta(seconds=1.5)).isoformat()
    r = push_world.publish(body=b'{"s": 1}', HTTP_X_BROKER_MESSAGE_ID="sch", HTTP_X_BROKER_SCHEDULED_FOR=when)
    assert r.status_code == 201
    dispatcher()
    start = time.monotonic()
    [got] = receiver.wait(lambda: receiver.at("/cb"), timeout=20, what="the scheduled callback")
    assert got.headers["x-broker-message-id"] == "sch" and got.body == b'{"s": 1}'
    assert got.at - start >= 0.5  # not before its time
