"""Validation at publish (issue 37 part 2) at every publish path: the single publish (fast lane and
full stack alike), the batch (the invalid item alone fails), a scheduled message (when it is
created, not again when due), and a replay (old messages are not validated again); payloads that
are not JSON; closed channels; nothing is stored for a refused message."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from rest_framework.test import APIClient

from broker.models import Message, ScheduledMessage
from jobs.models import Job
from jobs.publish.scheduled import scheduled_dispatch_due
from tests.web.api.test_fast_lane import both
from tests.web.api.test_fast_lane_publish import PUBLISH, same

pytestmark = pytest.mark.django_db
ORDER = {"type": "object", "required": ["id", "items"], "additionalProperties": False,
         "properties": {"id": {"type": "integer"}, "note": {"type": "string"},
                        "items": {"type": "array", "items": {"type": "object", "required": ["sku"],
                                                             "properties": {"sku": {"type": "string"},
                                                                            "qty": {"type": "integer", "minimum": 1}}}}}}
VALID = {"id": 1, "items": [{"sku": "a", "qty": 1}]}
TYPE = "HTTP_X_BROKER_MESSAGE_TYPE"


@pytest.fixture
def typed(world, api):
    r = api.put("/channel/ch1/event-type/order.created", {"schema": ORDER}, format="json")
    assert r.status_code == 200, r.content
    return world


def publish(world, payload, message_type="order.created", **headers):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return world.publish(body=body, **({TYPE: message_type} if message_type else {}), **headers)


def test_a_valid_payload_is_published_and_an_invalid_one_is_422_with_its_path(typed):
    assert publish(typed, VALID, HTTP_X_BROKER_MESSAGE_ID="ok").status_code == 201
    r = publish(typed, {"id": 2, "items": [{"sku": "a"}, {"sku": "b", "qty": 0}]}, HTTP_X_BROKER_MESSAGE_ID="bad")
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "schema_validation_failed" and body["path"] == "/items/1/qty"
    assert "minimum" in body["detail"] or "less than" in body["detail"]
    assert set(body) == {"error", "detail", "path"}
    r = publish(typed, {"id": "x", "items": []})
    assert r.status_code == 422 and r.json()["path"] == "/id"
    r = publish(typed, {"items": []})
    assert r.status_code == 422 and r.json()["path"] == "" and "id" in r.json()["detail"]
    assert list(Message.objects.values_list("message_id", flat=True)) == ["ok"]  # nothing stored for a refusal
    assert Job.objects.filter(message__message_id="bad").count() == 0


def test_other_types_and_untyped_messages_pass_on_an_open_channel(typed):
    assert publish(typed, b"not json at all", message_type="other.type").status_code == 201
    assert publish(typed, b"not json at all", message_type=None).status_code == 201


@pytest.mark.parametrize(("body", "content_type"), [
    (b"{not json", "application/json"), (b'{"id": 1', "application/json"), (b"\xff\xfe", "application/json"),
    (b"NaN", "application/json"), (json.dumps(VALID).encode(), "application/xml"),
])
def test_a_payload_that_is_not_json_is_422_for_a_type_with_a_schema(typed, body, content_type):
    r = typed.publish(body=body, content_type=content_type, **{TYPE: "order.created"})
    assert r.status_code == 422 and r.json()["error"] == "schema_validation_failed" and r.json()["path"] == ""
    assert not Message.objects.exists()


def test_json_without_a_json_content_type_is_validated(typed):
    """No content type (octet-stream) or text/plain: the payload is read as JSON all the same."""
    for content_type in ("", "text/plain", "application/vnd.order+json"):
        r = typed.publish(body=json.dumps(VALID).encode(), content_type=content_type, **{TYPE: "order.created"})
        assert r.status_code == 201, (content_type, r.content)


def test_credentials_are_refused_before_the_payload(typed):
    r = publish(typed, {"id": "x"}, channel_token="wrong")
    assert r.status_code == 403 and "path" not in r.json()
    r = publish(typed, {"id": "x"}, producer_token="wrong")
    assert r.status_code == 403


@pytest.mark.parametrize("payload,code", [(VALID, 201), ({"id": "x", "items": []}, 422)])
def test_the_fast_lane_answers_as_the_full_stack(typed, settings, payload, code):
    fast, full = both(settings, "POST", "/channel/ch1/broadcast", json.dumps(payload).encode(),
                      **PUBLISH, CONTENT_TYPE="application/json", HTTP_X_BROKER_MESSAGE_TYPE="order.created")
    assert same(fast, full).status_code == code


def test_a_closed_channel_refuses_types_it_has_no_event_type_for(typed, api):
    r = api.put("/channel/ch1", {"eventTypes": "closed"}, HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"])
    assert r.status_code == 200
    r = publish(typed, VALID, message_type="order.cancelled")
    assert r.status_code == 422 and r.json()["error"] == "unknown_event_type" and "order.cancelled" in r.json()["detail"]
    r = publish(typed, VALID, message_type=None)
    assert r.status_code == 422 and r.json()["error"] == "unknown_event_type"
    assert publish(typed, VALID).status_code == 201
    # a type without a schema is known: any payload
    assert api.put("/channel/ch1/event-type/ping", {"description": "free"}, format="json").status_code == 200
    assert publish(typed, b"pong", message_type="ping").status_code == 201
    # open again: unknown types pass
    r = api.put("/channel/ch1", {"eventTypes": "open"}, HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"])
    assert publish(typed, VALID, message_type="order.cancelled").status_code == 201


def test_a_schema_change_applies_to_the_next_publish(typed, api):
    assert publish(typed, {"id": 1, "items": [], "note": "n"}).status_code == 201
    assert api.put("/channel/ch1/event-type/order.created", {"schema": {**ORDER, "properties": {
        **ORDER["properties"], "note": {"type": "integer"}}}}, format="json").json()["Version"] == 2
    r = publish(typed, {"id": 1, "items": [], "note": "n"})
    assert r.status_code == 422 and r.json()["path"] == "/note" and "version 2" in r.json()["detail"]
    assert api.delete("/channel/ch1/event-type/order.created").status_code == 204
    assert publish(typed, b"anything", HTTP_X_BROKER_MESSAGE_ID="after-delete").status_code == 201


def batch(items, **headers):
    return APIClient().post("/channel/ch1/messages", items, format="json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                            HTTP_X_BROKER_PRODUCER_ID="p1", HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)


def test_a_batch_publishes_the_valid_items_and_marks_each_invalid_one(typed):
    r = batch([{"MessageID": "b1", "Type": "order.created", "Payload": VALID},
               {"MessageID": "b2", "Type": "order.created", "Payload": {"id": 2, "items": [{"qty": 1}]}},
               {"MessageID": "b3", "Type": "other", "Payload": "free text"},
               {"MessageID": "b4", "Type": "order.created", "Payload": "not json"},
               {"MessageID": "b1", "Type": "order.created", "Payload": VALID}])
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["Created"], body["Duplicates"], body["Invalid"]) == (2, 1, 2)
    statuses = [(i["MessageID"], i["Status"]) for i in body["Result"]]
    assert statuses == [("b1", "created"), ("b2", "invalid"), ("b3", "created"), ("b4", "invalid"), ("b1", "duplicate")]
    bad = body["Result"][1]
    assert bad["error"] == "schema_validation_failed" and bad["path"] == "/items/0" and "sku" in bad["detail"]
    assert body["Result"][3]["path"] == ""
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["b1", "b3"]


def test_a_batch_with_every_item_invalid_creates_nothing(typed):
    r = batch([{"Payload": {"id": "x"}}], HTTP_X_BROKER_MESSAGE_TYPE="order.created")  # the header's type applies
    assert r.status_code == 200
    assert r.json()["Invalid"] == 1 and r.json()["Result"][0]["Status"] == "invalid"
    assert r.json()["Result"][0]["MessageID"] is None
    assert not Message.objects.exists()


def test_a_batch_on_a_closed_channel(typed, api):
    api.put("/channel/ch1", {"eventTypes": "closed"}, HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"])
    r = batch([{"Type": "order.created", "Payload": VALID}, {"Type": "nope", "Payload": VALID}])
    assert [i["Status"] for i in r.json()["Result"]] == ["created", "invalid"]
    assert r.json()["Result"][1]["error"] == "unknown_event_type"


def _later(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat()


def test_a_scheduled_message_is_validated_when_created_and_not_again_when_due(typed, api):
    r = publish(typed, {"id": "x"}, HTTP_X_BROKER_SCHEDULED_FOR=_later(3600))
    assert r.status_code == 422 and r.json()["error"] == "schema_validation_failed"
    assert not ScheduledMessage.objects.exists()
    r = publish(typed, VALID, HTTP_X_BROKER_SCHEDULED_FOR=_later(3600), HTTP_X_BROKER_MESSAGE_ID="s1")
    assert r.status_code == 201
    # the schema changes so that s1 no longer fits; when due it is published all the same
    api.put("/channel/ch1/event-type/order.created", {"schema": {"type": "string"}}, format="json")
    ScheduledMessage.objects.update(dispatch_at=datetime.now(timezone.utc) - timedelta(seconds=1))
    assert scheduled_dispatch_due() == 1
    assert Message.objects.filter(message_id="s1").exists()


def test_a_replay_does_not_validate_old_messages_again(typed, api, make):
    assert publish(typed, VALID, HTTP_X_BROKER_MESSAGE_ID="old").status_code == 201
    api.put("/channel/ch1/event-type/order.created", {"schema": {"type": "string"}}, format="json")
    assert publish(typed, VALID).status_code == 422  # the old payload no longer fits
    make.consumer("late", type="pull", token="late-token", callback=None)
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    r = api.post("/channel/ch1/consumer/late/replay", {"since": since}, format="json")
    assert r.status_code in (200, 202), r.content
    assert Job.objects.filter(consumer__consumer_id="late", message__message_id="old").count() == 1
