"""The OpenAPI schema says what an operation requires (issue 29, part 5): inputs the API refuses
to go without are marked required there, so a client generated from the schema sends them."""

from __future__ import annotations

import re

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


# --- the pull routes (issue 29 part 5, the rest) ----------------------------------------------------

def _body(schema, path, method="post"):
    request_body = schema[path][method]["requestBody"]
    return request_body, request_body["content"]["application/json"]["schema"]


def _param(schema, path, method, name):
    [param] = [p for p in schema[path][method]["parameters"] if p["name"] == name]
    return param


def test_unpin_requires_its_group(schema, world, api):
    request_body, body = _body(schema, f"{C}/unpin")
    assert request_body["required"] is True and body["required"] == ["group"]
    assert body["properties"]["group"]["pattern"] == "^[a-zA-Z0-9/_=-]{1,16}$"
    r = api.post("/channel/ch1/consumer/c2/unpin", {}, format="json")
    assert r.status_code == 400 and r.json()["error"] == "group_missing"


def test_limits_are_bounded_as_the_handlers_read_them(schema, world, api):
    for path, default, maximum in (("advisories", 100, 1000), ("queued-jobs", 25, 100)):
        limit = _param(schema, f"{C}/{path}", "get", "limit")["schema"]
        assert limit == {"type": "integer", "minimum": 0, "maximum": maximum, "default": default}
        assert api.get(f"/channel/ch1/consumer/c2/{path}?limit=-1").status_code == 400
        assert api.get(f"/channel/ch1/consumer/c2/{path}?limit=0").status_code == 200
        assert api.get(f"/channel/ch1/consumer/c2/{path}?limit={maximum + 1}").status_code == 200  # clipped


def test_older_than_is_a_date_time_or_seconds(schema, world, api):
    older_than = _param(schema, f"{C}/queued-jobs", "delete", "olderThan")["schema"]
    assert older_than["anyOf"][0] == {"type": "string", "format": "date-time"}
    assert older_than["anyOf"][1]["minimum"] == 0 and older_than["anyOf"][1]["exclusiveMaximum"] == 1e10  # OpenAPI 3.1
    url = "/channel/ch1/consumer/c2/queued-jobs?olderThan="
    # any RFC 3339 offset (PostgreSQL takes at most +-15:59: the time is sent in UTC)
    for value in ("2020-01-01T00:00:00%2B23:59", "0001-01-01T00:00:00-23:59", "9999-12-31T23:59:59.5Z", "1e-05"):
        r = api.delete(url + value)
        assert r.status_code == 200 and r.json() == {"deletedCount": 0}, (value, r.content)
    assert api.delete(url + "0001-01-01T00:00:00%2B00:01").json()["error"] == "invalid_olderThan"  # before year 1


def test_bodies_the_routes_cannot_go_without_are_required(schema):
    for path in (f"{C}/ack", f"{C}/job/{{job_id}}", f"{C}/unpin", f"{C}/replay", f"{C}/dlq"):
        assert schema[path]["post"]["requestBody"]["required"] is True, path
    for path in (f"{C}/pull", f"{C}/job/{{job_id}}/progress"):  # an empty body is a default pull / progress
        assert "required" not in schema[path]["post"]["requestBody"], path
    _, ack = _body(schema, f"{C}/ack")
    assert ack["properties"]["Jobs"]["maxItems"] == 1000 and ack["properties"]["Jobs"]["minItems"] == 1
    _, pull = _body(schema, f"{C}/pull")
    assert pull["properties"]["batch"]["maximum"] == 1000 and pull["properties"]["expires"]["maximum"] == 60


def test_state_preconditions_are_documented(schema):
    """409 and 412 where the operation can answer them."""
    assert "409" in schema[f"{C}/job/{{job_id}}"]["post"]["responses"]  # message_expired
    assert "409" in schema[f"{C}/job/{{job_id}}/requeue-dead-job"]["post"]["responses"]  # message_expired
    assert "409" in schema[f"{C}/job/{{job_id}}/progress"]["post"]["responses"]  # stale_receipt, job_not_inflight
    assert "412" in schema[f"{C}/pull"]["post"]["responses"]  # consumer_not_pull
    for path in ("/channel/{channel_id}", "/producer/{producer_id}", C):
        assert "412" in schema[path]["put"]["responses"]


# --- the other operations --------------------------------------------------------------------------

def test_cursors_and_statuses_are_what_the_lists_read(schema, world, api):
    cursor = _param(schema, "/channels", "get", "next")["schema"]
    assert cursor["maxLength"] == 24 and cursor["pattern"].startswith("^")
    status = _param(schema, "/channel/{channel_id}/messages", "get", "status")
    assert status["explode"] is False and set(status["schema"]["items"]["enum"]) == {
        "ACKNOWLEDGED", "DISPATCHED", "101", "102"}
    for _ in range(26):
        world.publish()
    page = api.get("/channel/ch1/messages?status=ACKNOWLEDGED,DISPATCHED").json()
    nxt = page["Pages"]["next"].split("next=")[1]
    assert re.fullmatch(cursor["pattern"], nxt)
    assert api.get(f"/channel/ch1/messages?next={nxt}").status_code == 200


def test_publish_headers_and_batches_are_bounded(schema):
    broadcast = schema["/channel/{channel_id}/broadcast"]["post"]
    assert broadcast["requestBody"]["required"] is True
    assert broadcast["requestBody"]["content"]["application/octet-stream"]["schema"]["minLength"] == 1
    priority = _param(schema, "/channel/{channel_id}/broadcast", "post", "X-Broker-Message-Priority")["schema"]
    assert (priority["minimum"], priority["maximum"]) == (-(2**31), 2**31 - 1)
    ttl = _param(schema, "/channel/{channel_id}/broadcast", "post", "X-Broker-Message-TTL")["schema"]
    assert (ttl["minimum"], ttl["maximum"]) == (1, 31_536_000)
    batch = schema["/channel/{channel_id}/messages"]["post"]["requestBody"]
    assert batch["required"] is True
    items = batch["content"]["application/json"]["schema"]["anyOf"][0]
    assert items["maxItems"] == 1000 and items["items"]["required"] == ["Payload"]


def test_an_update_precondition_is_an_http_date(schema, world, api):
    header = _param(schema, "/channel/{channel_id}", "put", "If-Unmodified-Since")
    last = api.get("/channel/ch1")["Last-Modified"]
    assert re.fullmatch(header["schema"]["pattern"], last)
    r = api.put("/channel/ch1", {"name": "renamed"}, HTTP_IF_UNMODIFIED_SINCE=last)
    assert r.status_code == 200, r.content
