"""Publishing (single and batch), message reads, counters, status and metrics."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from rest_framework.test import APIClient

from broker.counters import JOB, MESSAGE, counters_compact, counts_for
from broker.models import Message
from jobs.models import Job, JobStatus
from jobs.state.transitions import INFLIGHT, QUEUED
from tests.jobs.moves import job_move

pytestmark = pytest.mark.django_db


def test_broadcast_creates_message_and_one_job_per_consumer(world):
    r = world.publish(body=b'{"a": 1}', HTTP_X_BROKER_MESSAGE_ID="m1", HTTP_X_BROKER_MESSAGE_PRIORITY="7")
    assert r.status_code == 201
    assert r["Location"] == "/channel/ch1/message/m1"
    message = Message.objects.get(message_id="m1")
    assert bytes(message.payload) == b'{"a": 1}'
    assert message.content_type == "application/json" and message.priority == 7
    jobs = list(Job.objects.filter(message=message).order_by("consumer__consumer_id"))
    assert [j.consumer.consumer_id for j in jobs] == ["c1", "c2"]
    assert all(j.status == JobStatus.QUEUED and j.priority == 7 and j.retry_count == 0 for j in jobs)


def test_broadcast_generates_id_and_default_content_type(world):
    r = world.publish(body=b"\x00\xffraw", content_type="")
    assert r.status_code == 201
    mid = r["Location"].rsplit("/", 1)[1]
    message = Message.objects.get(message_id=mid)
    assert message.content_type == "application/octet-stream"
    assert bytes(message.payload) == b"\x00\xffraw"


def test_broadcast_error_codes(world, settings):
    assert world.publish(channel="nope").status_code == 404
    r = world.publish(channel_token="wrong")
    assert r.status_code == 403 and r.json()["error"] == "channel_token_mismatch"
    assert world.publish(producer="ghost").status_code == 401
    assert world.publish(producer_token="bad").status_code == 403
    assert world.publish(body=b"").status_code == 400
    assert world.publish(HTTP_X_BROKER_MESSAGE_PRIORITY="high").status_code == 400
    assert world.publish(HTTP_X_BROKER_MESSAGE_PRIORITY="99999999999").status_code == 400
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="dup").status_code == 201
    dup = world.publish(HTTP_X_BROKER_MESSAGE_ID="dup")
    assert dup.status_code == 409 and dup.json()["error"] == "duplicate_message_id"
    settings.BROKER_MAX_PAYLOAD_BYTES = 10
    big = world.publish(body=b"x" * 11)
    assert big.status_code == 413 and big.json()["error"] == "payload_too_large"
    assert Message.objects.count() == 1, "failed publishes store nothing"


def test_missing_producer_headers_is_401(world):
    r = APIClient().post("/channel/ch1/broadcast", b"x", content_type="text/plain",
                         HTTP_X_BROKER_CHANNEL_TOKEN="ch-token")
    assert r.status_code == 401


def test_metadata_headers_are_stored(world):
    r = world.publish(HTTP_X_BROKER_METADATA_HEADERS="X-Trace-Id, traceparent,X-Absent",
                      HTTP_X_TRACE_ID="abc", HTTP_TRACEPARENT="00-1-2-01")
    assert r.status_code == 201
    message = Message.objects.get()
    assert message.headers == {"X-Trace-Id": "abc", "traceparent": "00-1-2-01"}


def test_publish_to_channel_without_consumers(make):
    make.channel("empty")
    make.producer()
    assert make.publish(channel="empty").status_code == 201
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_publish_is_atomic(world):
    """If the fan-out fails, the message is not stored either (one statement, one transaction)."""
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION fail_job_insert() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'boom'; END $$;
            CREATE TRIGGER fail_job_insert BEFORE INSERT ON jobs_job
            FOR EACH ROW EXECUTE FUNCTION fail_job_insert();
        """)
    try:
        client = APIClient(raise_request_exception=False)
        r = client.post("/channel/ch1/broadcast", b"x", content_type="text/plain",
                        HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                        HTTP_X_BROKER_PRODUCER_TOKEN="p-token", HTTP_X_BROKER_MESSAGE_ID="atomic")
        assert r.status_code >= 500
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER fail_job_insert ON jobs_job; DROP FUNCTION fail_job_insert();")
    assert not Message.objects.filter(message_id="atomic").exists()
    assert Job.objects.count() == 0
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="atomic").status_code == 201
    assert Job.objects.count() == 2


def batch(**kw):
    return {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_PRODUCER_ID": "p1",
            "HTTP_X_BROKER_PRODUCER_TOKEN": "p-token", **kw}


def test_batch_publish(world):
    items = [{"MessageID": f"b{i}", "Payload": f"payload {i}", "Priority": i % 3} for i in range(5)]
    items.append({"Payload": {"json": True}})
    items.append({"MessageID": "b0", "Payload": "again"})  # duplicate within the batch
    r = APIClient().post("/channel/ch1/messages", items, format="json", **batch())
    assert r.status_code == 201
    body = r.json()
    assert body["Created"] == 6 and body["Duplicates"] == 1
    statuses = [x["Status"] for x in body["Result"]]
    assert statuses == ["created"] * 6 + ["duplicate"]
    assert Message.objects.count() == 6
    assert Job.objects.count() == 12
    assert bytes(Message.objects.get(message_id="b0").payload) == b"payload 0"
    auto = Message.objects.exclude(message_id__startswith="b").get()
    assert auto.content_type == "application/json" and json.loads(bytes(auto.payload)) == {"json": True}
    again = APIClient().post("/channel/ch1/messages", items[:2], format="json", **batch())
    assert again.status_code == 200 and again.json()["Duplicates"] == 2


def test_batch_publish_errors(world, settings):
    client = APIClient()
    assert client.post("/channel/ch1/messages", b"{bad", content_type="application/json", **batch()).status_code == 400
    assert client.post("/channel/ch1/messages", [], format="json", **batch()).status_code == 400
    assert client.post("/channel/ch1/messages", [{"NoPayload": 1}], format="json", **batch()).status_code == 400
    assert client.post("/channel/ch1/messages", [{"Payload": "x", "Priority": "hi"}], format="json",
                       **batch()).status_code == 400
    too_many = [{"Payload": "x"}] * 1001
    assert client.post("/channel/ch1/messages", too_many, format="json", **batch()).status_code == 413
    assert client.post("/channel/ch1/messages", [{"Payload": "x"}], format="json",
                       **batch(HTTP_X_BROKER_CHANNEL_TOKEN="bad")).status_code == 403
    assert Message.objects.count() == 0


def test_message_reads_need_channel_or_admin_token(world):
    world.publish(HTTP_X_BROKER_MESSAGE_ID="m1", HTTP_X_BROKER_METADATA_HEADERS="X-A", HTTP_X_A="1")
    anon = APIClient()
    assert anon.get("/channel/ch1/message/m1").status_code == 401
    assert anon.get("/channel/ch1/message/m1", HTTP_X_BROKER_CHANNEL_TOKEN="bad").status_code == 403
    r = anon.get("/channel/ch1/message/m1", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token")
    assert r.status_code == 200
    body = r.json()
    assert body["ID"] == "m1" and body["Payload"] == '{"hello": "world"}'
    assert body["ContentType"] == "application/json" and body["ProducedBy"] == "p1"
    assert body["Status"] == "DISPATCHED" and body["Headers"] == {"X-A": "1"}
    assert body["ReceivedAt"]
    assert sorted((j["ConsumerID"], j["Status"]) for j in body["Jobs"]) == [("c1", "QUEUED"), ("c2", "QUEUED")]
    assert anon.get("/channel/ch1/message/none", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token").status_code == 404


def test_messages_list_and_status_filter(world, api):
    for i in range(30):
        world.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}")
    page1 = api.get("/channel/ch1/messages").json()
    assert len(page1["Result"]) == 25 and page1["Result"][0] == "/channel/ch1/message/m29"
    page2 = api.get(page1["Pages"]["next"]).json()
    assert len(page2["Result"]) == 5
    dispatched = api.get("/channel/ch1/messages?status=DISPATCHED").json()
    assert len(dispatched["Result"]) == 25 and "status=DISPATCHED" in dispatched["Pages"]["next"]
    assert api.get("/channel/ch1/messages?status=102").json()["Result"] == dispatched["Result"]
    assert api.get("/channel/ch1/messages?status=ACKNOWLEDGED").json()["Result"] == []
    assert api.get("/channel/ch1/messages?status=bogus").status_code == 400


def test_counters_track_jobs_and_messages(world, api):
    for i in range(4):
        world.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}")
    c1 = world.api.get("/channel/ch1/consumer/c1").json()
    consumer_pk = Job.objects.filter(consumer__consumer_id="c1").first().consumer_id
    assert counts_for(scope=JOB, owner_ids=[consumer_pk])[consumer_pk] == {JobStatus.QUEUED: 4}

    job = Job.objects.filter(consumer_id=consumer_pk).first()
    assert job_move(job_id=job.pk, from_status=QUEUED, to_status=INFLIGHT, reason="t", timeout=30)
    counters_compact()
    assert counts_for(scope=JOB, owner_ids=[consumer_pk])[consumer_pk] == {JobStatus.QUEUED: 3, JobStatus.INFLIGHT: 1}
    status = api.get("/channel/ch1/messages-status").json()
    assert status["counts"]["DISPATCHED"]["Count"] == 4
    assert status["counts"]["DISPATCHED"]["Links"]["messages"] == "/channel/ch1/messages?status=102"
    assert status["consumers"]["c1"]["QUEUED"] == 3 and status["consumers"]["c1"]["INFLIGHT"] == 1
    assert c1["ID"] == "c1"
    channel_pk = Message.objects.first().channel_id
    assert counts_for(scope=MESSAGE, owner_ids=[channel_pk])[channel_pk] == {102: 4}


def test_status_and_metrics(world):
    anon = APIClient()
    r = anon.get("/_status")
    assert r.status_code == 200 and r.json()["Database"] == "ok"
    world.publish()
    metrics = anon.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.content.decode()
    assert 'broker_consumer_backlog{channel="ch1",consumer="c1"} 1.0' in text
    assert "dead_job_count" in text


def test_openapi_schema_covers_every_endpoint(api):
    from django.urls import get_resolver

    schema = APIClient().get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = set(json.loads(schema.content)["paths"])
    for pattern in get_resolver().url_patterns:
        if hasattr(pattern, "url_patterns") and "admin" not in str(pattern.pattern) and "schema" not in str(pattern.pattern):
            for sub in pattern.url_patterns:
                if not hasattr(getattr(sub, "callback", None), "cls"):
                    continue  # HTML pages for staff (e.g. the pipeline report), not API endpoints
                route = "/" + str(sub.pattern).replace("<str:", "{").replace(">", "}")
                route = route.replace("{path:", "{")
                assert route in paths, f"{route} missing from the OpenAPI schema"
    assert APIClient().get("/api/docs/").status_code == 200
