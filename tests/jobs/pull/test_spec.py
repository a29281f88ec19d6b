"""The pull-consumer spec, endpoint by endpoint (jobs.pull.spec): queued-jobs, the job state
machine, auth codes, job details, requeue and delete of dead jobs."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from broker.xid import job_pk, job_xid
from jobs.publish.auth import publish_authenticate
from jobs.publish.messages import NewMessage, messages_publish
from jobs.push.claim import jobs_claim_push
from jobs.state.transitions import DEAD, INFLIGHT, QUEUED
from tests.conftest import ADMIN_TOKEN
from tests.jobs.moves import job_move
from tests.jobs.pull.conftest import PULL_HEADERS, PullClient, claim_one, job_status, publish_n

pytestmark = pytest.mark.django_db


def job_in(pc, status: str) -> str:
    """A fresh job of consumer c2 in the given state, reached through the API."""
    jid = pc.queued().json()["Result"][0]["ID"]
    if status == "QUEUED":
        return jid
    assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202
    if status in ("DELIVERED", "DEAD"):
        assert pc.set_state(jid, {"NextState": status}).status_code == 202
    return jid


# (current state, request body, expected HTTP status, expected state afterwards, retry count afterwards)
TRANSITIONS = [
    ("QUEUED", {"NextState": "INFLIGHT"}, 202, "INFLIGHT", 0),
    ("QUEUED", {"NextState": "INFLIGHT", "IncrementalTimeout": 10}, 202, "INFLIGHT", 0),
    ("QUEUED", {"NextState": "DELIVERED"}, 400, "QUEUED", 0),
    ("QUEUED", {"NextState": "DEAD"}, 400, "QUEUED", 0),
    ("QUEUED", {"NextState": "DELIVERED", "IncrementalTimeout": 10}, 400, "QUEUED", 0),
    ("QUEUED", {"NextState": "QUEUED"}, 400, "QUEUED", 0),
    ("INFLIGHT", {"NextState": "INFLIGHT"}, 202, "INFLIGHT", 0),
    ("INFLIGHT", {"NextState": "INFLIGHT", "IncrementalTimeout": 10}, 400, "INFLIGHT", 0),
    ("INFLIGHT", {"NextState": "DELIVERED"}, 202, "DELIVERED", 0),
    ("INFLIGHT", {"NextState": "DEAD"}, 202, "DEAD", 0),
    ("INFLIGHT", {"NextState": "DELIVERED", "IncrementalTimeout": 10}, 400, "INFLIGHT", 0),
    ("INFLIGHT", {"NextState": "DEAD", "IncrementalTimeout": 10}, 400, "INFLIGHT", 0),
    ("INFLIGHT", {"NextState": "QUEUED"}, 400, "INFLIGHT", 0),
    ("DELIVERED", {"NextState": "INFLIGHT"}, 400, "DELIVERED", 0),
    ("DELIVERED", {"NextState": "INFLIGHT", "IncrementalTimeout": 10}, 400, "DELIVERED", 0),
    ("DELIVERED", {"NextState": "DELIVERED"}, 202, "DELIVERED", 0),
    ("DELIVERED", {"NextState": "DEAD"}, 400, "DELIVERED", 0),
    ("DEAD", {"NextState": "INFLIGHT"}, 202, "INFLIGHT", 1),
    ("DEAD", {"NextState": "INFLIGHT", "IncrementalTimeout": 10}, 202, "INFLIGHT", 1),
    ("DEAD", {"NextState": "DEAD"}, 202, "DEAD", 0),
    ("DEAD", {"NextState": "DEAD", "IncrementalTimeout": 10}, 400, "DEAD", 0),
    ("DEAD", {"NextState": "DELIVERED"}, 400, "DEAD", 0),
    ("DEAD", {"NextState": "QUEUED"}, 400, "DEAD", 0),
]


ENDPOINTS = [
    ("GET", "/queued-jobs"), ("GET", "/job/{job}"), ("POST", "/job/{job}"), ("POST", "/pull"), ("POST", "/ack"),
    ("POST", "/job/{job}/progress"), ("POST", "/job/{job}/requeue-dead-job"),
]


@pytest.mark.parametrize("current, body, code, after, retry", TRANSITIONS)
def test_transition_table(world, pc, current, body, code, after, retry):
    publish_n(world, 1)
    jid = job_in(pc, current)
    r = pc.set_state(jid, body)
    assert r.status_code == code, r.content
    if code == 400:
        assert r.json()["error"]
    else:
        assert r.content == b""
    assert job_status(jid) == (after, retry)


def test_same_state_changes_nothing(world, pc):
    publish_n(world, 1)
    jid = claim_one(pc)
    before = pc.job(jid).json()
    assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202
    assert pc.job(jid).json() == before


def test_dead_to_inflight_has_no_retry_cap(world, pc, api):
    api.put("/channel/ch1/consumer/c2", {"maxRetry": 1}, HTTP_IF_UNMODIFIED_SINCE=api.get(
        "/channel/ch1/consumer/c2").headers["Last-Modified"])
    publish_n(world, 1)
    jid = job_in(pc, "DEAD")
    for n in range(1, 4):
        assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202
        assert job_status(jid) == ("INFLIGHT", n)
        assert pc.set_state(jid, {"NextState": "DEAD"}).status_code == 202
        assert job_status(jid) == ("DEAD", n)


def test_incremental_timeout_sets_deadline_and_is_sticky(world, pc, settings):
    settings.BROKER_CONNECTION_TIMEOUT = 1.0
    settings.BROKER_RATIONAL_DELAY = 0.5
    publish_n(world, 1)
    from jobs.models import Job

    jid = claim_one(pc, IncrementalTimeout=20)
    job = Job.objects.get(pk=job_pk(jid))
    assert abs((job.deadline - job.status_changed_at).total_seconds() - 21.75) < 0.01
    assert pc.job(jid).json()["IncrementalTimeout"] == 20
    assert pc.set_state(jid, {"NextState": "DEAD"}).status_code == 202
    assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202  # without a timeout: kept
    job = Job.objects.get(pk=job_pk(jid))
    assert abs((job.deadline - job.status_changed_at).total_seconds() - 21.75) < 0.01


@pytest.mark.parametrize("raw", [
    "{not json", "[]", '"INFLIGHT"', "", '{"NextState": "FLYING"}', '{"NextState": 3}', '{"NextState": null}',
    '{"NextState": "INFLIGHT", "IncrementalTimeout": -1}', '{"NextState": "INFLIGHT", "IncrementalTimeout": "5"}',
    '{"NextState": "INFLIGHT", "IncrementalTimeout": true}', '{"NextState": "INFLIGHT", "IncrementalTimeout": 1e300}',
    b"\xff\xfe",
])
def test_malformed_state_requests_are_400(world, pc, raw):
    publish_n(world, 1)
    jid = pc.queued().json()["Result"][0]["ID"]
    r = pc.set_state(jid, None, raw=raw)
    assert r.status_code == 400, r.content
    assert job_status(jid) == ("QUEUED", 0)


def test_go_style_field_names_and_zero_timeout(world, pc):
    """Go decodes JSON keys case-insensitively, and a zero IncrementalTimeout means 'not given'."""
    publish_n(world, 1)
    jid = pc.queued().json()["Result"][0]["ID"]
    assert pc.set_state(jid, {"nextState": "INFLIGHT"}).status_code == 202
    assert pc.set_state(jid, {"NextState": "DELIVERED", "IncrementalTimeout": 0}).status_code == 202


def test_job_ids_that_name_no_job_are_404(world, pc, make):
    publish_n(world, 1)
    for bad in ("abc", "1.0", "-1", "99999999", "999999999999999999999", "%20"):
        r = pc.set_state(bad, {"NextState": "INFLIGHT"})
        assert r.status_code == 404, (bad, r.content)
        assert pc.job(bad).status_code == 404
    # a job of another (pull) consumer of the same channel
    make.consumer("c3", type="pull", token="c3-token", callback=None)
    publish_n(world, 1, start=1)
    other = PullClient(pc.client, "/channel/ch1/consumer/c3",
                       {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c3-token"})
    jid = other.queued().json()["Result"][0]["ID"]
    assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 404
    assert pc.job(jid).status_code == 404
    assert job_status(jid) == ("QUEUED", 0)


def test_queued_jobs_shape(world, pc):
    world.publish(body=b'{"a": 1}', HTTP_X_BROKER_MESSAGE_ID="shape", HTTP_X_BROKER_MESSAGE_PRIORITY="7",
                  HTTP_X_BROKER_METADATA_HEADERS="X-Trace", HTTP_X_TRACE="t-1")
    [job] = pc.queued().json()["Result"]
    assert set(job) == {"ID", "Priority", "IncrementalTimeout", "Message"}
    assert job["Priority"] == 7 and job["IncrementalTimeout"] == 0
    # the ID is an xid (webhook-broker's clients decode it as xid.ID) naming this job
    assert re.fullmatch(r"[0-9a-v]{20}", job["ID"])
    from jobs.models import Job

    assert job_pk(job["ID"]) == Job.objects.get(consumer__consumer_id="c2", message__message_id="shape").pk
    traceparent = Job.objects.get(consumer__consumer_id="c2", message__message_id="shape").message.traceparent
    assert job["Message"] == {"MessageID": "shape", "Payload": '{"a": 1}', "ContentType": "application/json",
                              "Headers": {"X-Trace": "t-1", "traceparent": traceparent}}  # issue 25: trace context


def test_binary_payload_is_base64(world, pc):
    world.publish(body=b"\xff\x00\xfe", content_type="application/octet-stream")
    [job] = pc.queued().json()["Result"]
    assert job["Message"]["Payload"] == "/wD+" and job["Message"]["PayloadEncoding"] == "base64"


def test_limit_default_clip_and_validation(world, pc):

    ctx = publish_authenticate(channel_id="ch1", channel_token="ch-token", producer_id="p1",
                                          producer_token="p-token")
    messages_publish(ctx=ctx, messages=[NewMessage(payload=b"x") for _ in range(130)])
    assert len(pc.queued().json()["Result"]) == 25
    assert len(pc.queued("?limit=").json()["Result"]) == 25
    assert len(pc.queued("?limit=7").json()["Result"]) == 7
    assert len(pc.queued("?limit=100").json()["Result"]) == 100
    assert len(pc.queued("?limit=101").json()["Result"]) == 100
    assert len(pc.queued("?limit=100000000000000000000").json()["Result"]) == 100
    assert pc.queued("?limit=0").json() == {"Result": []}
    for bad in ("-1", "abc", "1.5", "1e3", "%201"):
        r = pc.queued(f"?limit={bad}")
        assert r.status_code == 400, (bad, r.content)
        assert r.json()["error"] == "invalid_limit"


def test_queued_jobs_order_priority_then_oldest(world, pc):
    for i, prio in enumerate([0, 5, 1, 5, 0, 9]):
        world.publish(body=b"x", HTTP_X_BROKER_MESSAGE_ID=f"o{i}", HTTP_X_BROKER_MESSAGE_PRIORITY=str(prio))
    got = [j["Message"]["MessageID"] for j in pc.queued().json()["Result"]]
    assert got == ["o5", "o1", "o3", "o2", "o0", "o4"]


def test_queued_jobs_lists_only_due_queued_jobs(world, pc):
    publish_n(world, 4)
    jobs = [j["ID"] for j in pc.queued().json()["Result"]]
    assert pc.set_state(jobs[0], {"NextState": "INFLIGHT"}).status_code == 202
    claimed = pc.pull(batch=1).json()["Result"][0]["ID"]
    # a negative acknowledgement with a delay: queued but not due yet
    assert pc.ack([{"ID": claimed, "NextState": "QUEUED", "Delay": 60}]).json()["Result"][0]["Status"] == "QUEUED"
    assert [j["ID"] for j in pc.queued().json()["Result"]] == jobs[2:]


def test_pull_consumer_jobs_are_not_listed_for_other_consumers(world, make, pc):
    make.consumer("c3", type="pull", token="c3-token", callback=None)
    publish_n(world, 2)
    other = PullClient(pc.client, "/channel/ch1/consumer/c3",
                       {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c3-token"})
    mine = {j["ID"] for j in pc.queued().json()["Result"]}
    theirs = {j["ID"] for j in other.queued().json()["Result"]}
    assert len(mine) == len(theirs) == 2 and not mine & theirs


@pytest.mark.parametrize("method, suffix", ENDPOINTS)
def test_auth_codes(world, pc, method, suffix):
    publish_n(world, 1)
    job = pc.queued().json()["Result"][0]["ID"]
    body = '{"NextState": "INFLIGHT"}' if suffix == "/job/{job}" else '{"Jobs": [{"ID": "1", "NextState": "DEAD"}]}'
    client = APIClient()

    def call(channel="ch1", consumer="c2", **headers):
        path = f"/channel/{channel}/consumer/{consumer}" + suffix.format(job=job)
        return client.generic(method, path, body if method == "POST" else "", content_type="application/json",
                              **headers)

    good = dict(PULL_HEADERS)
    assert call("nochannel", **good).status_code == 404
    assert call(**{**good, "HTTP_X_BROKER_CHANNEL_TOKEN": "wrong"}).status_code == 403
    assert call(HTTP_X_BROKER_CONSUMER_TOKEN="c2-token").status_code == 401
    assert call(consumer="nobody", **good).status_code == 404
    assert call(**{**good, "HTTP_X_BROKER_CONSUMER_TOKEN": "wrong"}).status_code == 403
    assert call(HTTP_X_BROKER_CHANNEL_TOKEN="ch-token").status_code == 401
    assert call(consumer="c1", **{**good, "HTTP_X_BROKER_CONSUMER_TOKEN": "c-token"}).status_code == 412
    assert job_status(job) == ("QUEUED", 0)


def test_get_job_shape(world, pc):
    publish_n(world, 1)
    jid = pc.queued().json()["Result"][0]["ID"]
    body = pc.job(jid).json()
    assert body["ID"] == jid and body["Status"] == "QUEUED"
    assert body["MessageURL"] == "/channel/ch1/message/m0"
    assert body["ChannelURL"] == "/channel/ch1" and body["ConsumerURL"] == "/channel/ch1/consumer/c2"
    assert body["ProducerURL"] == "/producer/p1" and body["ListenerName"] == "c2"
    assert body["JobRequeueURL"] == "" and body["RetryCount"] == 0 and body["StatusChangedAt"].endswith("Z")
    assert APIClient().get(f"/channel/ch1/consumer/c2/job/{jid}", HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).json() == body


def test_requeue_dead_job(world, pc):
    publish_n(world, 2)
    jid = job_in(pc, "DEAD")
    assert pc.set_state(jid, {"NextState": "INFLIGHT"}).status_code == 202
    assert pc.set_state(jid, {"NextState": "DEAD"}).status_code == 202
    assert job_status(jid) == ("DEAD", 1)
    assert pc.requeue(jid).status_code == 202
    assert job_status(jid) == ("QUEUED", 0)
    assert pc.requeue(jid).status_code == 400  # not dead any more
    assert jid in [j["ID"] for j in pc.queued().json()["Result"]]


def test_delete_dead_job(world, pc, make):
    publish_n(world, 2)
    live = pc.queued().json()["Result"][1]["ID"]
    jid = job_in(pc, "DEAD")
    assert pc.delete(live).status_code == 404  # not dead
    assert pc.delete(jid).status_code == 204
    assert pc.delete(jid).status_code == 404
    assert pc.job(jid).status_code == 404


def test_delete_dead_job_of_push_consumer_with_admin_token(world, pc):
    from jobs.models import Job

    publish_n(world, 1)
    job = Job.objects.get(consumer__consumer_id="c1")
    job_move(job_id=job.pk, from_status=QUEUED, to_status=INFLIGHT, reason="test", timeout=30)
    job_move(job_id=job.pk, from_status=INFLIGHT, to_status=DEAD, reason="test")
    path = f"/channel/ch1/consumer/c1/job/{job_xid(job.pk)}"
    assert APIClient().delete(f"/channel/ch1/consumer/c1/job/{job.pk}",
                              HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).status_code == 404, "an integer is no job ID"
    assert APIClient().delete(path, HTTP_X_BROKER_ADMIN_TOKEN="wrong").status_code == 403
    assert APIClient().delete(path).status_code == 401
    push = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c-token"}
    assert APIClient().get(path, **push).status_code == 412  # the pull endpoints stay pull-only
    assert APIClient().delete(path, HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).status_code == 204
    assert not Job.objects.filter(pk=job.pk).exists()


def test_jobs_of_pull_consumers_are_never_pushed(world, pc):
    """The push dispatcher's claim only takes push consumers' jobs."""
    publish_n(world, 3)
    claimed = jobs_claim_push(limit=100)
    from jobs.models import Job

    consumers = set(Job.objects.filter(pk__in=[j.id for j in claimed]).values_list("consumer__consumer_id", flat=True))
    assert consumers <= {"c1"}
    assert len(pc.queued().json()["Result"]) == 3
