"""Job IDs and generated message IDs are xids (github.com/rs/xid): the IDs the API shows map back
to the jobs in the database (the codec without a database: tests/broker/unit/test_xid_codec.py)."""

from __future__ import annotations

import re

import pytest

from broker import xid
from broker.xid import job_pk, job_xid, xid_bytes

XID_RE = re.compile(r"[0-9a-v]{20}")

# --- the API's IDs map back to the jobs ----------------------------------------------------------------

@pytest.mark.django_db
def test_every_job_id_the_api_shows_maps_back_to_its_job(world, client_anon):
    from jobs.models import Job

    for i in range(3):
        assert world.publish(HTTP_X_BROKER_MESSAGE_ID=f"x{i}").status_code == 201
    pull = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"}
    listed = client_anon.get("/channel/ch1/consumer/c2/queued-jobs", **pull).json()["Result"]
    assert len(listed) == 3
    for item in listed:
        job = Job.objects.select_related("message").get(pk=job_pk(item["ID"]))
        assert job.consumer.consumer_id == "c2" and job.message.message_id == item["Message"]["MessageID"]
        detail = client_anon.get(f"/channel/ch1/consumer/c2/job/{item['ID']}", **pull)
        assert detail.status_code == 200 and detail.json()["ID"] == item["ID"]
    message = world.api.get("/channel/ch1/message/x0").json()
    for job in message["Jobs"]:
        assert Job.objects.get(pk=job_pk(job["ID"])).consumer.consumer_id == job["ConsumerID"]
    # a URL with anything but a job ID is a 404, never a 500
    some = Job.objects.filter(consumer__consumer_id="c2").first()
    wrong_check = xid._encode_int((xid._check(some.pk) ^ 0xFF) << 64 | some.pk)
    for bad in (str(some.pk), wrong_check, job_xid(some.pk).upper(), "garbage", "%C3%A9" * 10, "0" * 20):
        r = client_anon.get(f"/channel/ch1/consumer/c2/job/{bad}", **pull)
        assert r.status_code == 404 and r.json()["error"] == "job_not_found", (bad, r.status_code)
        r = client_anon.generic("POST", f"/channel/ch1/consumer/c2/job/{bad}", '{"NextState": "INFLIGHT"}',
                                content_type="application/json", **pull)
        assert r.status_code == 404, (bad, r.status_code)


@pytest.mark.django_db
def test_generated_message_ids_are_xids(world):
    r = world.publish()
    assert r.status_code == 201
    mid = r["Location"].rsplit("/", 1)[1]
    assert XID_RE.fullmatch(mid) and xid_bytes(mid) is not None
    batch = world.api.post("/channel/ch1/messages", [{"Payload": "a"}, {"Payload": "b", "MessageID": "mine"}],
                           format="json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                           HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
    assert batch.status_code == 201, batch.content
    ids = [item["MessageID"] for item in batch.json()["Result"]]
    assert XID_RE.fullmatch(ids[0]) and ids[1] == "mine"
