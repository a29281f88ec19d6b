"""Dead-letter endpoints, job/DLQ status, signing-secret rotation: auth, shapes, effects."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from broker.counters import counters_compact
from jobs.models import Job, JobStatus
from jobs.pull.claim import jobs_claim
from jobs.state.transitions import DEAD, INFLIGHT
from tests.jobs.moves import Move, jobs_move

pytestmark = pytest.mark.django_db

CONSUMER_HEADERS = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c-token"}


def make_dead(consumer_id: str, n: int) -> list[int]:
    """Publish-created jobs of a consumer moved QUEUED -> INFLIGHT -> DEAD through the state machine."""
    jobs = list(Job.objects.filter(consumer__consumer_id=consumer_id, status=JobStatus.QUEUED)
                .order_by("id").values_list("id", "consumer_id")[:n])
    assert len(jobs) == n
    consumer_pk = jobs[0][1]
    claimed = jobs_claim(consumer_pk=consumer_pk, limit=n)
    moved = jobs_move(moves=[Move(job_id=j.id, from_status=INFLIGHT, to_status=DEAD)
                                   for j in claimed], reason="test")
    assert len(moved) == n
    return [j.id for j in claimed]


@pytest.fixture
def dead_world(world):
    for i in range(30):
        assert world.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i:02d}").status_code == 201
    make_dead("c1", 27)
    make_dead("c2", 4)
    return world


def test_dlq_lists_dead_jobs_in_pages(dead_world):
    client = APIClient()
    r = client.get("/channel/ch1/consumer/c1/dlq", **CONSUMER_HEADERS)
    assert r.status_code == 200
    body = r.json()
    assert len(body["DeadJobs"]) == 25 and body["Pages"]["next"]
    first = body["DeadJobs"][0]
    assert first["Status"] == "DEAD" and first["ListenerName"] == "c1"
    assert first["MessageURL"] == "/channel/ch1/message/m26"  # newest first
    assert first["JobRequeueURL"] == f"/channel/ch1/consumer/c1/job/{first['ID']}/requeue-dead-job"
    assert first["StatusChangedAt"].endswith("Z")
    page2 = client.get(body["Pages"]["next"], **CONSUMER_HEADERS).json()
    assert len(page2["DeadJobs"]) == 2 and "next" not in page2["Pages"]
    ids = {j["ID"] for j in body["DeadJobs"]} | {j["ID"] for j in page2["DeadJobs"]}
    assert len(ids) == 27


def test_dlq_read_needs_consumer_or_admin_token(dead_world, api):
    client = APIClient()
    assert client.get("/channel/ch1/consumer/c1/dlq").status_code == 401
    assert client.get("/channel/ch1/consumer/c1/dlq", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                      HTTP_X_BROKER_CONSUMER_TOKEN="wrong").status_code == 403
    assert client.get("/channel/ch1/consumer/c1/dlq", HTTP_X_BROKER_ADMIN_TOKEN="wrong").status_code == 403
    assert api.get("/channel/ch1/consumer/c1/dlq").status_code == 200
    assert api.get("/channel/ch1/consumer/nope/dlq").status_code == 404
    assert api.get("/channel/nope/consumer/c1/dlq").status_code == 404


def test_dlq_works_for_pull_consumers(dead_world):
    r = APIClient().get("/channel/ch1/consumer/c2/dlq", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                        HTTP_X_BROKER_CONSUMER_TOKEN="c2-token")
    assert r.status_code == 200 and len(r.json()["DeadJobs"]) == 4


def test_dlq_requeue_needs_the_consumer_token_as_form_field(dead_world):
    client = APIClient()
    r = client.post("/channel/ch1/consumer/c1/dlq", {"requeue": "wrong"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_requeue_token"
    assert client.post("/channel/ch1/consumer/c1/dlq", {}).status_code == 400
    r = client.post("/channel/ch1/consumer/c1/dlq", {"requeue": "c-token"}, format="json")
    assert r.status_code == 415
    r = client.post("/channel/ch1/consumer/c1/dlq", {"requeue": "c-token"})
    assert r.status_code == 202 and r.json()["requeuedCount"] == 27
    jobs = Job.objects.filter(consumer__consumer_id="c1")
    assert set(jobs.values_list("status", flat=True)) == {JobStatus.QUEUED}
    assert set(jobs.values_list("retry_count", flat=True)) == {0}
    assert Job.objects.filter(consumer__consumer_id="c2", status=JobStatus.DEAD).count() == 4


def test_dlq_purge_and_counts(dead_world, api):
    client = APIClient()
    assert client.delete("/channel/ch1/consumer/c1/dlq").status_code == 401
    assert client.delete("/channel/ch1/consumer/c1/dlq", HTTP_X_BROKER_CHANNEL_TOKEN="bad",
                         HTTP_X_BROKER_CONSUMER_TOKEN="c-token").status_code == 403
    status = api.get("/dlq-status").json()
    assert {c["consumerId"]: c["deadCount"] for c in status["consumers"]} == {"c1": 27, "c2": 4}
    entry = next(c for c in status["consumers"] if c["consumerId"] == "c1")
    assert entry["channelId"] == "ch1" and entry["channelName"] == "CH1" and entry["consumerName"] == "c1"
    r = client.delete("/channel/ch1/consumer/c1/dlq", **CONSUMER_HEADERS)
    assert r.status_code == 200 and r.json() == {"deletedCount": 27}
    counters_compact()
    status = api.get("/dlq-status").json()
    assert {c["consumerId"]: c["deadCount"] for c in status["consumers"]} == {"c2": 4}
    assert Job.objects.filter(consumer__consumer_id="c1").count() == 3  # the live ones stay


def test_job_status_counts_per_consumer_and_status(dead_world, api):
    assert APIClient().get("/job-status").status_code == 401
    assert APIClient().get("/dlq-status", HTTP_X_BROKER_ADMIN_TOKEN="nope").status_code == 403
    body = api.get("/job-status").json()
    as_map = {cid: {e["statusName"]: e["count"] for e in entries} for cid, entries in body["ch1"].items()}
    assert as_map == {"c1": {"QUEUED": 3, "DEAD": 27}, "c2": {"QUEUED": 26, "DEAD": 4}}
    assert {e["status"] for e in body["ch1"]["c1"]} == {1001, 1004}


def test_rotate_secret_is_admin_only(world, api):
    client = APIClient()
    assert client.post("/channel/ch1/consumer/c1/rotate-secret").status_code == 401
    assert client.post("/channel/ch1/consumer/c1/rotate-secret", HTTP_X_BROKER_ADMIN_TOKEN="x").status_code == 403
    assert client.post("/channel/ch1/consumer/c1/rotate-secret", **CONSUMER_HEADERS).status_code == 401
    assert api.post("/channel/ch1/consumer/nope/rotate-secret").status_code == 404
    assert api.post("/channel/ch1/consumer/c1/rotate-secret", {"graceSeconds": "soon"}).status_code == 400
    r = api.post("/channel/ch1/consumer/c1/rotate-secret", {"graceSeconds": "60"})
    assert r.status_code == 200
    body = r.json()
    assert body["SigningSecret"].startswith("whsec_") and body["PreviousSecretExpiresAt"].endswith("Z")
    assert api.get("/channel/ch1/consumer/c1").json()["SigningSecret"] == body["SigningSecret"]
    reader = client.get("/channel/ch1/consumer/c1", **CONSUMER_HEADERS).json()
    assert "SigningSecret" not in reader
