"""The OpenAPI schema says what an operation requires (issue 29, part 5): inputs the API refuses
to go without are marked required there, so a client generated from the schema sends them."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db
C = "/channel/{channel_id}/consumer/{consumer_id}"


@pytest.fixture
def schema(api):
    return api.get("/api/schema/?format=json").json()["paths"]


def test_deleting_a_consumer_requires_if_unmodified_since(schema, world, api):
    [header] = [p for p in schema[C]["delete"]["parameters"] if p["name"] == "If-Unmodified-Since"]
    assert header["required"] is True and header["in"] == "header"
    assert {"400", "412"} <= set(schema[C]["delete"]["responses"])
    r = api.delete("/channel/ch1/consumer/c1")
    assert r.status_code == 400 and r.json()["error"] == "precondition_required"
    [put_header] = [p for p in schema[C]["put"]["parameters"] if p["name"] == "If-Unmodified-Since"]
    assert not put_header.get("required")  # a PUT that creates needs none


def test_replay_requires_since_as_a_date_time(schema, world, api):
    body = schema[f"{C}/replay"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["since"] and body["properties"]["since"]["format"] == "date-time"
    assert set(body["properties"]) == {"since", "until", "onlyFailed"}
    r = api.post("/channel/ch1/consumer/c1/replay", {"onlyFailed": True}, format="json")
    assert r.status_code == 400 and r.json()["error"] == "invalid_since"


def test_the_dlq_requeue_requires_its_form_field(schema, world, client_anon):
    body = schema[f"{C}/dlq"]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
    assert body["required"] == ["requeue"]
    r = client_anon.post("/channel/ch1/consumer/c1/dlq", {})
    assert r.status_code == 400 and r.json()["error"] == "invalid_requeue_token"
