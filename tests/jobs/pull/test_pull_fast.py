"""The fast path: atomic batch pull, batch ack (with negative acknowledgements), progress, and
consumer statistics."""

from __future__ import annotations

import json
import threading
import time

import pytest

from broker import xid
from broker.xid import job_pk, job_xid
from jobs import state
from tests.jobs.pull.conftest import job_status, publish_n

pytestmark = pytest.mark.django_db


def bulk_publish(n, priority=0, payload=b"x"):
    from jobs import publishing

    ctx = publishing.publish_authenticate(channel_id="ch1", channel_token="ch-token", producer_id="p1",
                                          producer_token="p-token")
    publishing.messages_publish(ctx=ctx, messages=[publishing.NewMessage(payload=payload, priority=priority)
                                                   for _ in range(n)])


def pull_one_short_deadline(world, pc, settings) -> str:
    """Publish one message and pull its job with an in-flight deadline of 0.75 s; the job's ID."""
    settings.BROKER_CONNECTION_TIMEOUT = 0.25
    settings.BROKER_RATIONAL_DELAY = 0.25
    publish_n(world, 1)
    return pc.pull().json()["Result"][0]["ID"]


def test_pull_claims_atomically_with_attempt_and_deadline(world, pc, settings):
    settings.BROKER_CONNECTION_TIMEOUT = 1.0
    settings.BROKER_RATIONAL_DELAY = 0.5
    publish_n(world, 5)
    r = pc.pull(batch=3, IncrementalTimeout=10)
    assert r.status_code == 200
    jobs = r.json()["Result"]
    assert [j["Message"]["MessageID"] for j in jobs] == ["m0", "m1", "m2"]
    for j in jobs:
        assert set(j) == {"ID", "Priority", "IncrementalTimeout", "Attempt", "Deadline", "Message"}
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


# --- ack -------------------------------------------------------------------------------------------

def test_ack_answers_per_job(world, pc, make):
    make.consumer("c3", type="pull", token="c3-token", callback=None)
    publish_n(world, 6)
    ids = [j["ID"] for j in pc.pull(batch=4).json()["Result"]]
    queued = pc.queued().json()["Result"][0]["ID"]
    from jobs.models import Job

    foreign = job_xid(Job.objects.filter(consumer__consumer_id="c3").first().pk)
    # job IDs are xids: the integer key of a job in flight, or its xid with other check bytes,
    # names no job
    integer = str(job_pk(ids[0]))
    wrong_check = xid._encode_int((xid._check(job_pk(ids[0])) ^ 1) << 64 | job_pk(ids[0]))
    r = pc.ack([
        {"ID": ids[0], "NextState": "DELIVERED"},
        {"ID": ids[1], "NextState": "DEAD"},
        {"ID": ids[2], "NextState": "QUEUED"},
        {"ID": ids[3], "NextState": "QUEUED", "Delay": 30},
        {"ID": queued, "NextState": "DELIVERED"},
        {"ID": foreign, "NextState": "DELIVERED"},
        {"ID": "123456789", "NextState": "DELIVERED"},
        {"ID": "not-a-number", "NextState": "DEAD"},
        {"ID": integer, "NextState": "DELIVERED"},
        {"ID": wrong_check, "NextState": "DELIVERED"},
    ])
    assert r.status_code == 200, r.content
    result = r.json()["Result"]
    assert [x["ID"] for x in result] == [ids[0], ids[1], ids[2], ids[3], queued, foreign, "123456789", "not-a-number",
                                         integer, wrong_check]
    assert result[0] == {"ID": ids[0], "Status": "DELIVERED", "RetryCount": 0}
    assert result[1] == {"ID": ids[1], "Status": "DEAD", "RetryCount": 0}
    assert result[2] == {"ID": ids[2], "Status": "QUEUED", "RetryCount": 1}
    assert result[3] == {"ID": ids[3], "Status": "QUEUED", "RetryCount": 1}
    assert result[4]["Error"] == "conflict" and result[4]["Status"] == "QUEUED"
    assert [x["Error"] for x in result[5:]] == ["not_found"] * 5
    assert job_status(foreign) == ("QUEUED", 0)
    # the nacked job without delay comes back at once, with its attempt number; the delayed one later
    nexts = pc.pull(batch=10).json()["Result"]
    by_id = {j["ID"]: j for j in nexts}
    assert ids[2] in by_id and by_id[ids[2]]["Attempt"] == 2 and ids[3] not in by_id


def test_nack_past_the_retry_limit_is_dead(world, pc, api):
    api.put("/channel/ch1/consumer/c2", {"maxRetry": 1}, HTTP_IF_UNMODIFIED_SINCE=api.get(
        "/channel/ch1/consumer/c2").headers["Last-Modified"])
    publish_n(world, 1)
    jid = pc.pull().json()["Result"][0]["ID"]
    assert pc.ack([{"ID": jid, "NextState": "QUEUED"}]).json()["Result"][0]["Status"] == "QUEUED"
    assert pc.pull().json()["Result"][0]["ID"] == jid
    assert pc.ack([{"ID": jid, "NextState": "QUEUED"}]).json()["Result"][0] == {"ID": jid, "Status": "DEAD",
                                                                                "RetryCount": 2}


def test_delivered_never_comes_back(world, pc):
    publish_n(world, 2)
    ids = [j["ID"] for j in pc.pull(batch=2).json()["Result"]]
    pc.ack([{"ID": i, "NextState": "DELIVERED"} for i in ids])
    assert pc.ack([{"ID": ids[0], "NextState": "QUEUED"}]).json()["Result"][0]["Error"] == "conflict"
    assert pc.set_state(ids[0], {"NextState": "INFLIGHT"}).status_code == 400
    assert pc.requeue(ids[0]).status_code == 400
    assert state.jobs_expire_inflight() == 0
    assert pc.pull(batch=10).json() == {"Result": []}
    assert [job_status(i) for i in ids] == [("DELIVERED", 0)] * 2


@pytest.mark.parametrize("raw, code", [
    ("{bad", 400), ("[]", 400), ('{"Jobs": []}', 400), ('{"Jobs": {}}', 400), ('{"Jobs": [1]}', 400),
    ('{"Jobs": [{"ID": "1"}]}', 400), ('{"Jobs": [{"ID": "1", "NextState": "INFLIGHT"}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "DELIVERED", "Delay": 5}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "QUEUED", "Delay": -5}]}', 400),
    ('{"Jobs": [{"ID": null, "NextState": "DEAD"}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "DEAD"}, {"ID": "1", "NextState": "DELIVERED"}]}', 400),
    # the same job twice (its job ID is the one spelling of it)
    (json.dumps({"Jobs": [{"ID": job_xid(1), "NextState": "DEAD"}, {"ID": job_xid(1), "NextState": "QUEUED"}]}), 400),
    (json.dumps({"Jobs": [{"ID": str(i), "NextState": "DEAD"} for i in range(1001)]}), 413),
])
def test_ack_validation(world, pc, raw, code):
    r = pc.ack(None, raw=raw)
    assert r.status_code == code, r.content
    assert "error" in r.json()


def test_ack_of_a_thousand_jobs(world, pc):
    bulk_publish(1000)
    ids = [j["ID"] for j in pc.pull(batch=1000).json()["Result"]]
    assert len(ids) == 1000
    result = pc.ack([{"ID": i, "NextState": "DELIVERED"} for i in ids]).json()["Result"]
    assert all(x["Status"] == "DELIVERED" and "Error" not in x for x in result)
    assert pc.stats()["NumDelivered"] == 1000


# --- progress --------------------------------------------------------------------------------------

def test_progress_extends_the_deadline_without_a_retry(world, pc, settings):
    from jobs.models import Job

    settings.BROKER_CONNECTION_TIMEOUT = 1.0
    settings.BROKER_RATIONAL_DELAY = 0.5
    publish_n(world, 2)
    jid = pc.pull().json()["Result"][0]["ID"]
    before = Job.objects.get(pk=job_pk(jid)).deadline
    r = pc.progress(jid, IncrementalTimeout=100)
    assert r.status_code == 200, r.content
    assert r.json()["ID"] == jid
    job = Job.objects.get(pk=job_pk(jid))
    assert (job.deadline - before).total_seconds() > 99 and job.retry_count == 0 and job.incremental_timeout == 100
    assert r.json()["Status"] == "INFLIGHT" and r.json()["RetryCount"] == 0
    # never shortens
    assert pc.progress(jid, IncrementalTimeout=1).status_code == 200
    assert Job.objects.get(pk=job_pk(jid)).deadline == job.deadline
    # not in flight: 409; another consumer's / unknown: 404
    queued = pc.queued().json()["Result"][0]["ID"]
    assert pc.progress(queued).status_code == 409
    assert pc.progress("99999999").status_code == 404
    assert pc.progress(jid, IncrementalTimeout=-1).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_progress_keeps_a_job_from_timing_out(world, pc, settings):
    jid = pull_one_short_deadline(world, pc, settings)
    for _ in range(3):
        time.sleep(0.4)
        assert pc.progress(jid).status_code == 200
    state.jobs_expire_inflight()
    assert job_status(jid) == ("INFLIGHT", 0)
    assert pc.ack([{"ID": jid, "NextState": "DELIVERED"}]).json()["Result"][0]["Status"] == "DELIVERED"


# --- statistics and long-poll (in-process) ---------------------------------------------------------

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
