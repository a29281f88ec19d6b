"""Event types in the registry (issue 37 part 1): PUT with a schema (an object, or a string holding
one; JSON or form fields), description, example and deprecated; versions on every change of
schema; GET, the list, DELETE; the refusals (invalid_schema with its reason, invalid_example, bad
names) and who may do what."""

from __future__ import annotations

import json

import pytest
from django.utils.http import http_date

from eventtypes.models import EventType, EventTypeVersion

pytestmark = pytest.mark.django_db
URL = "/channel/ch1/event-type/order.created"
ORDER = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}, "total": {"type": "number"}}}


def put(api, url=URL, **data):
    return api.put(url, data, format="json")


def test_a_put_creates_version_1_and_a_changed_schema_makes_version_2(api, make):
    make.channel()
    r = put(api, schema=ORDER, description="An order was placed", example={"id": 7}, deprecated=False)
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["ID"], body["Type"], body["Version"], body["Schema"]) == ("order.created", "order.created", 1, ORDER)
    assert body["Description"] == "An order was placed" and body["Example"] == {"id": 7} and body["Deprecated"] is False
    assert [v["Version"] for v in body["Versions"]] == [1] and r["Last-Modified"]

    # the same schema again: no new version; a description change alone neither
    assert put(api, schema=ORDER, description="Placed").json()["Version"] == 1
    v2 = {**ORDER, "required": ["id", "total"]}
    r = put(api, schema=v2, example={"id": 7, "total": 1.5})
    assert r.status_code == 200 and r.json()["Version"] == 2
    got = api.get(URL).json()
    assert got["Version"] == 2 and got["Schema"] == v2 and got["Description"] == "Placed"
    assert [(v["Version"], v["Schema"]) for v in got["Versions"]] == [(1, ORDER), (2, v2)]  # every version readable
    assert EventTypeVersion.objects.filter(event_type__name="order.created").count() == 2


def test_schema_as_a_string_and_form_fields(api, make):
    make.channel()
    r = put(api, schema=json.dumps(ORDER))
    assert r.status_code == 200 and r.json()["Schema"] == ORDER
    r = api.put("/channel/ch1/event-type/user.signup", {"schema": json.dumps(ORDER), "description": "from a form",
                                                         "example": '{"id": 1}', "deprecated": "true"})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["Schema"] == ORDER and body["Example"] == {"id": 1} and body["Deprecated"] is True


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "bogus"}, "bogus"),
    ({"properties": {"a": {"minimum": "ten"}}}, "ten"),
    ({"pattern": "(unclosed"}, "regex"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"$ref": "https://example.com/schema.json"}, "example.com"),
    ([1, 2], "JSON object"),
    ("{not json", "not JSON"),
    ({"$schema": "http://json-schema.org/draft-07/schema#"}, "2020-12"),
])
def test_a_schema_that_is_not_valid_is_400_invalid_schema_with_the_reason(api, make, schema, reason):
    make.channel()
    r = put(api, schema=schema)
    assert r.status_code == 400 and r.json()["error"] == "invalid_schema", r.content
    assert reason in r.json()["detail"]
    assert not EventType.objects.exists()


def test_an_example_must_validate(api, make):
    make.channel()
    r = put(api, schema=ORDER, example={"id": "seven"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_example"
    assert "/id" in r.json()["detail"] and not EventType.objects.exists()
    assert put(api, schema=ORDER, example={"id": 7}).status_code == 200
    r = put(api, example={"total": 1})
    assert r.status_code == 400 and r.json()["error"] == "invalid_example"
    # a new schema the kept example no longer fits: the example is dropped (and said so)
    r = put(api, schema={**ORDER, "properties": {"id": {"type": "string"}}})
    assert r.status_code == 200 and r.json()["Example"] is None and r.json()["Version"] == 2 and r.json()["Warnings"]


def test_no_schema_is_allowed_and_clearing_it_is_a_version(api, make):
    make.channel()
    r = put(api, description="free-form")
    assert r.status_code == 200 and r.json()["Schema"] is None and r.json()["Version"] == 1
    assert put(api, schema=ORDER).json()["Version"] == 2
    r = put(api, schema=None)
    assert r.json()["Version"] == 3 and r.json()["Schema"] is None


def test_list_get_and_delete(api, make, client_anon):
    make.channel()
    for name in ("b.second", "a.first", "c/with:slash"):
        assert put(api, f"/channel/ch1/event-type/{name}", schema=ORDER).status_code == 200
    listing = api.get("/channel/ch1/event-types").json()
    assert listing["EventTypes"] == "open"
    assert [t["Type"] for t in listing["Result"]] == ["a.first", "b.second", "c/with:slash"]
    assert "Versions" not in listing["Result"][0] and listing["Result"][0]["Version"] == 1
    assert api.get("/channel/ch1/event-type/c/with:slash").json()["Type"] == "c/with:slash"
    # the channel token reads them too (producers and consumers see the schemas)
    assert client_anon.get("/channel/ch1/event-types", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token").status_code == 200
    assert client_anon.get("/channel/ch1/event-types", HTTP_X_BROKER_CHANNEL_TOKEN="nope").status_code == 403
    assert client_anon.get("/channel/ch1/event-types").status_code == 401
    r = api.delete("/channel/ch1/event-type/b.second")
    assert r.status_code == 204
    assert api.get("/channel/ch1/event-type/b.second").status_code == 404
    assert api.delete("/channel/ch1/event-type/b.second").json()["error"] == "event_type_not_found"
    assert not EventTypeVersion.objects.filter(event_type__name="b.second").exists()


def test_writes_need_the_admin_token(make, client_anon, api):
    make.channel()
    r = client_anon.put(URL, {"schema": ORDER}, format="json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token")
    assert r.status_code == 401
    r = client_anon.put(URL, {"schema": ORDER}, format="json", HTTP_X_BROKER_ADMIN_TOKEN="wrong")
    assert r.status_code == 403 and set(r.json()) == {"error", "detail"}
    assert client_anon.delete(URL, HTTP_X_BROKER_ADMIN_TOKEN="wrong").status_code == 403
    assert not EventType.objects.exists()
    assert api.put("/channel/nope/event-type/x", {"schema": ORDER}, format="json").status_code == 404


@pytest.mark.parametrize("name", ["has space", "x" * 129, "bad*char"])
def test_the_type_follows_the_message_type_rules(api, make, name):
    make.channel()
    r = put(api, f"/channel/ch1/event-type/{name}", schema=ORDER)
    assert r.status_code == 400 and r.json()["error"] == "invalid_message_type"


def test_if_unmodified_since_is_optional_but_checked_when_given(api, make):
    make.channel()
    r = put(api, schema=ORDER)
    stale = http_date(0)
    r2 = api.put(URL, {"description": "x"}, format="json", HTTP_IF_UNMODIFIED_SINCE=stale)
    assert r2.status_code == 412 and r2.json()["error"] == "precondition_failed"
    r3 = api.put(URL, {"description": "x"}, format="json", HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r3.status_code == 200 and r3["Last-Modified"] != r["Last-Modified"]
    assert api.delete(URL, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"]).status_code == 412
    assert api.delete(URL, HTTP_IF_UNMODIFIED_SINCE=r3["Last-Modified"]).status_code == 204


def test_the_channel_shows_and_takes_event_types(api, make):
    body = make.channel()
    assert body["EventTypes"] == "open" and body["EventTypesURL"] == "/channel/ch1/event-types"
    r = api.put("/channel/ch1", {"eventTypes": "closed"}, HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"])
    assert r.status_code == 200 and r.json()["EventTypes"] == "closed"
    r = api.put("/channel/ch1", {"eventTypes": "ajar"}, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r.status_code == 400 and r.json()["error"] == "invalid_event_types"
