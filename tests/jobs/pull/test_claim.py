"""The batch pull (jobs.pull.claim): atomic claims with attempt and deadline, order, max_bytes,
validation, the long-poll wait, and the consumer's statistics."""

from __future__ import annotations

import threading
import time

import pytest

from tests.jobs.pull.conftest import bulk_publish, job_status, publish_n, pull_one_short_deadline

pytestmark = pytest.mark.django_db


def test_pull_claims_atomically_with_attempt_and_deadline(world, pc, settings):
    settings.BROKER_CONNECTION_TIMEOUT = 1.0
    settings.BROKER_RATIONAL_DELAY = 0.5
    publish_n(world, 5)
    r = pc.pull(batch=3, IncrementalTimeout=10)
    assert r.status_code == 200
    jobs = r.json()["Result"]
    assert [j["Message"]["MessageID"] for j in jobs] == ["m0", "m1", "m2"]
    for j in jobs:
        # issue 23: every claim carries its receipt (an opaque string) for ack and progress
        assert set(j) == {"ID", "Priority", "IncrementalTimeout", "Attempt", "Deadline", "Message", "Receipt"}
        assert j["Attempt"] == 1 and j["IncrementalTimeout"] == 10 and j["Deadline"].endswith("Z")
        assert job_status(j["ID"]) == ("INFLIGHT", 0)
    # claimed jobs are gone from the queue; the rest come next
    assert [j["Message"]["MessageID"] for j in pc.pull(batch=10).json()["Result"]] == ["m3", "m4"]
    assert pc.pull(batch=10).json() == {"Result": []}


def test_pull_defaults_to_one_job_and_accepts_an_empty_body(world, pc):
    publish_n(world, 3)
    r = pc.client.generic("POST", f"{pc.base}/pull", "", **pc.headers)
    assert r.status_code == 200 and len(r.json()["Result"]) == 1


def test_pull_order_is_priority_then_oldest(world, pc):
    for i, prio in enumerate([0, 5, 1, 5]):
        world.publish(body=b"x", HTTP_X_BROKER_MESSAGE_ID=f"o{i}", HTTP_X_BROKER_MESSAGE_PRIORITY=str(prio))
    assert [j["Message"]["MessageID"] for j in pc.pull(batch=4).json()["Result"]] == ["o1", "o3", "o2", "o0"]


def test_pull_max_bytes_cuts_the_batch_but_returns_at_least_one(world, pc):
    bulk_publish(5, payload=b"a" * 100)
    assert len(pc.pull(batch=10, max_bytes=250).json()["Result"]) == 2
    assert len(pc.pull(batch=10, max_bytes=10).json()["Result"]) == 1
    assert len(pc.pull(batch=10, max_bytes=10_000).json()["Result"]) == 2


@pytest.mark.parametrize("body", [
    {"batch": 0}, {"batch": 1001}, {"batch": "5"}, {"batch": 1.5}, {"batch": True},
    {"expires": -1}, {"expires": 61}, {"expires": "1"}, {"no_wait": "yes"},
    {"max_bytes": 0}, {"max_bytes": "10"}, {"IncrementalTimeout": -5},
])
def test_pull_validation(world, pc, body):
    publish_n(world, 1)
    r = pc.pull(**body)
    assert r.status_code == 400, r.content
    assert pc.stats()["NumAckPending"] == 0


def test_pull_malformed_json(world, pc):
    r = pc.client.generic("POST", f"{pc.base}/pull", "{nope", content_type="application/json", **pc.headers)
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"
    r = pc.client.generic("POST", f"{pc.base}/pull", "[1]", content_type="application/json", **pc.headers)
    assert r.status_code == 400


def test_no_wait_returns_at_once(world, pc):
    t0 = time.monotonic()
    assert pc.pull(batch=5, expires=30, no_wait=True).json() == {"Result": []}
    assert time.monotonic() - t0 < 5


def test_consumer_statistics(world, pc, api):
    publish_n(world, 6)
    ids = [j["ID"] for j in pc.pull(batch=4).json()["Result"]]
    pc.ack([{"ID": ids[0], "NextState": "DELIVERED"}, {"ID": ids[1], "NextState": "DEAD"},
            {"ID": ids[2], "NextState": "QUEUED"}])
    stats = pc.stats()
    assert {k: stats[k] for k in ("NumPending", "NumAckPending", "NumRedelivered", "NumWaiting", "NumDead",
                                  "NumDelivered")} == {
        "NumPending": 3, "NumAckPending": 1, "NumRedelivered": 1, "NumWaiting": 0, "NumDead": 1, "NumDelivered": 1}
    assert api.get("/channel/ch1/consumer/c2").json()["NumPending"] == 3


@pytest.mark.django_db(transaction=True)
def test_long_poll_is_woken_by_a_publish_and_counts_as_waiting(world, pc):
    results = {}

    def waiter():
        from django.db import connection

        t0 = time.monotonic()
        r = pc.pull(batch=5, expires=20)
        results["elapsed"] = time.monotonic() - t0
        results["jobs"] = r.json()["Result"]
        connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while pc.stats()["NumWaiting"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pc.stats()["NumWaiting"] == 1
    published = time.monotonic()
    batch = [{"MessageID": "m0", "Payload": "a"}, {"MessageID": "m1", "Payload": "b"}]
    r = world.api.post("/channel/ch1/messages", batch, format="json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                       HTTP_X_BROKER_PRODUCER_ID="p1", HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
    assert r.status_code == 201, r.content
    thread.join(25)
    assert not thread.is_alive()
    latency = time.monotonic() - published
    assert [j["Message"]["MessageID"] for j in results["jobs"]] == ["m0", "m1"]
    print(f"long-poll wake-up (in-process): {latency * 1000:.0f} ms")
    assert latency < 4.5  # woken by NOTIFY, well before the 5 s safety-net re-check
    assert pc.stats()["NumWaiting"] == 0


@pytest.mark.django_db(transaction=True)
def test_long_poll_times_out_empty_and_wakes_for_a_delayed_job(world, pc):
    t0 = time.monotonic()
    assert pc.pull(expires=0.5).json() == {"Result": []}
    assert 0.4 < time.monotonic() - t0 < 5
    publish_n(world, 1)
    jid = pc.pull().json()["Result"][0]["ID"]
    pc.ack([{"ID": jid, "NextState": "QUEUED", "Delay": 1}])
    t0 = time.monotonic()
    got = pc.pull(expires=10).json()["Result"]
    assert [j["ID"] for j in got] == [jid] and got[0]["Attempt"] == 2
    assert 0.5 < time.monotonic() - t0 < 5  # woke when the delay ran out, not at the end of the wait


@pytest.mark.django_db(transaction=True)
def test_long_poll_picks_up_a_timed_out_job(world, pc, settings):
    jid = pull_one_short_deadline(world, pc, settings)
    t0 = time.monotonic()
    got = pc.pull(expires=10).json()["Result"]
    assert [j["ID"] for j in got] == [jid] and got[0]["Attempt"] == 2
    assert time.monotonic() - t0 < 5


@pytest.mark.django_db(transaction=True)
def test_a_waiting_pull_after_a_partial_claim_takes_what_gathers_within_the_window(world, pc, settings):
    """BROKER_PULL_WINDOW: a long-poll right after a claim that did not fill its batch (the consumer
    had caught up) claims once the window has passed, so publishes arriving meanwhile come in one
    batch; a pull after a full claim (behind a backlog) or without waiting is never held."""
    settings.BROKER_PULL_WINDOW = 1.0
    publish_n(world, 1)
    assert len(pc.pull(batch=10, expires=5).json()["Result"]) == 1  # not full: caught up
    publish_n(world, 1, start=1)

    def later():
        time.sleep(0.3)  # within the window of the next pull
        publish_n(world, 1, start=2)
        from django.db import connection

        connection.close()

    thread = threading.Thread(target=later)
    thread.start()
    got = pc.pull(batch=10, expires=5).json()["Result"]
    thread.join(10)
    assert [j["Message"]["MessageID"] for j in got] == ["m1", "m2"]  # one batch, not m1 alone
    # a full claim (batch 1): the next pull is not held, even with a job already waiting
    publish_n(world, 2, start=3)
    assert [j["Message"]["MessageID"] for j in pc.pull(batch=1, expires=5).json()["Result"]] == ["m3"]
    t0 = time.monotonic()
    assert [j["Message"]["MessageID"] for j in pc.pull(batch=1, expires=5).json()["Result"]] == ["m4"]
    assert time.monotonic() - t0 < 0.9  # (the window is 1 s: it was not waited for)
