"""Scheduled messages: create (X-Broker-Scheduled-For), read, list, count, dispatch, cancel."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from rest_framework.test import APIClient

from broker.models import Message, ScheduledMessage
from jobs.models import Job, JobStatus
from jobs.publish.scheduled import scheduled_dispatch_due

pytestmark = pytest.mark.django_db(transaction=True)  # now() must advance between statements

PUBLISHER = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_PRODUCER_ID": "p1",
             "HTTP_X_BROKER_PRODUCER_TOKEN": "p-token"}
READER = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token"}


def at(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def sched(world, settings):
    settings.BROKER_MIN_SCHEDULE_DELAY = 0.5  # at(1.5) keeps a second of slack for a slow request
    return world


def test_schedule_read_list_and_count(sched):
    r = sched.publish(body=b'{"later": 1}', HTTP_X_BROKER_MESSAGE_ID="s1", HTTP_X_BROKER_SCHEDULED_FOR=at(3600),
                      HTTP_X_BROKER_MESSAGE_PRIORITY="4", HTTP_X_BROKER_METADATA_HEADERS="X-T", HTTP_X_T="v")
    assert r.status_code == 201
    assert r["Location"] == "/channel/ch1/scheduled-message/s1"
    assert Message.objects.count() == 0 and Job.objects.count() == 0
    client = APIClient()
    assert client.get("/channel/ch1/scheduled-message/s1").status_code == 401
    body = client.get("/channel/ch1/scheduled-message/s1", **READER).json()
    assert body["messageId"] == "s1" and body["status"] == "SCHEDULED" and body["dispatchedAt"] is None
    assert body["payload"] == '{"later": 1}' and body["priority"] == 4 and body["producedBy"] == "p1"
    assert body["headers"] == {"X-T": "v"} and body["dispatchSchedule"].endswith("Z")
    listing = client.get("/channel/ch1/scheduled-messages", **READER).json()
    assert listing["result"] == ["/channel/ch1/scheduled-message/s1"] == listing["Result"]
    assert client.get("/channel/ch1/scheduled-messages?status=DISPATCHED", **READER).json()["result"] == []
    assert client.get("/channel/ch1/scheduled-messages?status=bogus", **READER).status_code == 400
    status = client.get("/channel/ch1/messages-status", **READER).json()
    assert status["counts"]["SCHEDULED_SCHEDULED"]["Count"] == 1
    assert status["counts"]["SCHEDULED_DISPATCHED"]["Count"] == 0
    assert status["counts"]["SCHEDULED_SCHEDULED"]["Links"]["messages"] == "/channel/ch1/scheduled-messages?status=101"
    assert status["next_scheduled_message_at"].endswith("Z")
    assert client.get("/channel/ch1/scheduled-message/none", **READER).status_code == 404


def test_bad_date_is_400_and_too_soon_is_412(sched):
    for bad in ("tomorrow", "2030-01-01", "2030-01-01T10:00:00", "2030-13-01T10:00:00Z"):
        r = sched.publish(HTTP_X_BROKER_SCHEDULED_FOR=bad)
        assert r.status_code == 400, bad
        assert r.json()["error"] == "invalid_scheduled_for"
    r = sched.publish(HTTP_X_BROKER_SCHEDULED_FOR=at(0.2))
    assert r.status_code == 412 and r.json()["error"] == "schedule_too_soon"
    assert sched.publish(HTTP_X_BROKER_SCHEDULED_FOR=at(-60)).status_code == 412
    assert sched.publish(HTTP_X_BROKER_SCHEDULED_FOR="2030-01-01T10:00:00+02:00").status_code == 201
    assert ScheduledMessage.objects.count() == 1


def test_duplicate_ids_are_409(sched):
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="x", HTTP_X_BROKER_SCHEDULED_FOR=at(60)).status_code == 201
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="x", HTTP_X_BROKER_SCHEDULED_FOR=at(90)).status_code == 409
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="y").status_code == 201
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="y", HTTP_X_BROKER_SCHEDULED_FOR=at(60)).status_code == 409


def test_due_messages_are_published_with_the_same_id_then_cancel_is_409(sched):
    assert sched.publish(body=b"A", HTTP_X_BROKER_MESSAGE_ID="due", HTTP_X_BROKER_SCHEDULED_FOR=at(1.5),
                         HTTP_X_BROKER_METADATA_HEADERS="X-Trace", HTTP_X_TRACE="t1").status_code == 201
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="later", HTTP_X_BROKER_SCHEDULED_FOR=at(3600)).status_code == 201
    assert scheduled_dispatch_due() == 0
    time.sleep(1.8)
    assert scheduled_dispatch_due() == 1
    message = Message.objects.get(message_id="due")
    assert bytes(message.payload) == b"A" and message.headers == {"X-Trace": "t1"}
    assert sorted(Job.objects.filter(message=message).values_list("consumer__consumer_id", "status")) == [
        ("c1", JobStatus.QUEUED), ("c2", JobStatus.QUEUED)]
    body = APIClient().get("/channel/ch1/scheduled-message/due", **READER).json()
    assert body["status"] == "DISPATCHED" and body["dispatchedAt"] and body["messageUrl"] == "/channel/ch1/message/due"
    r = APIClient().delete("/channel/ch1/scheduled-message/due", **PUBLISHER)
    assert r.status_code == 409 and r.json()["error"] == "already_dispatched"
    assert scheduled_dispatch_due() == 0  # published once


def test_cancel_before_dispatch(sched, api):
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="c", HTTP_X_BROKER_SCHEDULED_FOR=at(1.5)).status_code == 201
    client = APIClient()
    assert client.delete("/channel/ch1/scheduled-message/c").status_code in (401, 403)
    assert client.delete("/channel/ch1/scheduled-message/c", **{**PUBLISHER, "HTTP_X_BROKER_PRODUCER_TOKEN": "x"}
                         ).status_code == 403
    assert client.delete("/channel/ch1/scheduled-message/c", **PUBLISHER).status_code == 204
    assert client.delete("/channel/ch1/scheduled-message/c", **PUBLISHER).status_code == 404
    time.sleep(1.8)
    assert scheduled_dispatch_due() == 0
    assert not Message.objects.filter(message_id="c").exists()
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="d", HTTP_X_BROKER_SCHEDULED_FOR=at(60)).status_code == 201
    assert api.delete("/channel/ch1/scheduled-message/d").status_code == 204


def test_only_the_scheduling_producer_may_cancel(sched):
    sched.producer("p2", token="p2-token")
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="mine", HTTP_X_BROKER_SCHEDULED_FOR=at(60)).status_code == 201
    r = APIClient().delete("/channel/ch1/scheduled-message/mine", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                           HTTP_X_BROKER_PRODUCER_ID="p2", HTTP_X_BROKER_PRODUCER_TOKEN="p2-token")
    assert r.status_code == 403


def test_id_taken_meanwhile_marks_the_scheduled_message_failed(sched):
    assert sched.publish(HTTP_X_BROKER_MESSAGE_ID="clash", HTTP_X_BROKER_SCHEDULED_FOR=at(1.5)).status_code == 201
    # a batch publish does not look at scheduled ids
    r = APIClient().post("/channel/ch1/messages", [{"MessageID": "clash", "Payload": "now"}], format="json", **PUBLISHER)
    assert r.status_code == 201
    time.sleep(1.8)
    assert scheduled_dispatch_due() == 0
    s = ScheduledMessage.objects.get(message_id="clash")
    assert s.status == ScheduledMessage.Status.FAILED and s.error
