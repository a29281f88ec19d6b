"""Import from an OpenAPI document (issue 37 part 4): 3.1 ``webhooks`` and 3.0 ``x-webhooks``,
component schemas bundled, 3.0 schemas read as 2020-12, ``dryRun``, updates as new versions, all or
nothing, and the broker's own schema imported into another channel."""

from __future__ import annotations

import json

import pytest
import yaml
from rest_framework.test import APIClient

from eventtypes.models import EventType

pytestmark = pytest.mark.django_db


def document_31() -> dict:
    invoice = {"type": "object", "required": ["id", "amount"],
               "properties": {"id": {"type": "string"}, "amount": {"$ref": "#/components/schemas/Money"}}}
    return {
        "openapi": "3.1.0", "info": {"title": "Billing", "version": "1"},
        "webhooks": {
            "invoice.paid": {"post": {
                "summary": "An invoice was paid", "description": "Sent once an invoice is paid in full.",
                "requestBody": {"content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Invoice"},
                    "examples": {"one": {"$ref": "#/components/examples/Paid"}}}}},
                "responses": {"200": {"description": "ok"}}}},
            "invoice.voided": {"post": {"summary": "An invoice was voided", "deprecated": True,
                                        "requestBody": {"content": {"application/json": {"schema": invoice}}},
                                        "responses": {"200": {"description": "ok"}}}},
            "bad key!": {"post": {"responses": {"200": {"description": "ok"}}}},
            "no.post": {"get": {"responses": {"200": {"description": "ok"}}}},
        },
        "components": {
            "schemas": {"Invoice": invoice,
                        "Money": {"type": "object", "required": ["cents"],
                                  "properties": {"cents": {"type": "integer"}, "currency": {"type": "string"}}}},
            "examples": {"Paid": {"value": {"id": "in_1", "amount": {"cents": 100, "currency": "EUR"}}}},
        },
    }


def post_import(api, document, channel="ch1", query=""):
    return api.post(f"/channel/{channel}/event-types/import{query}", json.dumps(document),
                    content_type="application/json")


def test_a_dry_run_changes_nothing_then_the_import_creates_and_updates(make, api):
    make.basics()
    r = post_import(api, document_31(), query="?dryRun=true")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["DryRun"] is True and (body["Created"], body["Updated"], body["Unchanged"]) == (2, 0, 0)
    assert sorted(s["Webhook"] for s in body["Skipped"]) == ["bad key!", "no.post"]
    assert not EventType.objects.exists()

    body = post_import(api, document_31()).json()
    assert body["DryRun"] is False and body["Created"] == 2
    paid = api.get("/channel/ch1/event-type/invoice.paid").json()
    assert paid["Description"] == "Sent once an invoice is paid in full." and paid["Deprecated"] is False
    assert paid["Example"] == {"id": "in_1", "amount": {"cents": 100, "currency": "EUR"}}
    assert paid["Schema"]["properties"]["amount"] == {"$ref": "#/$defs/Money"} and "Money" in paid["Schema"]["$defs"]
    assert api.get("/channel/ch1/event-type/invoice.voided").json()["Deprecated"] is True

    # the bundled schema is enforced at publish, $defs included
    ok = make.publish(body=b'{"id": "in_2", "amount": {"cents": 5}}', HTTP_X_BROKER_MESSAGE_TYPE="invoice.paid")
    assert ok.status_code == 201
    bad = make.publish(body=b'{"id": "in_3", "amount": {"cents": "5"}}', HTTP_X_BROKER_MESSAGE_TYPE="invoice.paid")
    assert bad.status_code == 422 and bad.json()["path"] == "/amount/cents"

    assert post_import(api, document_31()).json()["Unchanged"] == 2
    changed = document_31()
    changed["components"]["schemas"]["Money"]["required"] = ["cents", "currency"]
    body = post_import(api, changed, query="?dryRun=1").json()
    assert [(x["Type"], x["Action"], x["Version"]) for x in body["Result"]] == [
        ("invoice.paid", "updated", 2), ("invoice.voided", "updated", 2)]
    assert api.get("/channel/ch1/event-type/invoice.paid").json()["Version"] == 1  # a dry run
    assert post_import(api, changed).json()["Updated"] == 2
    assert api.get("/channel/ch1/event-type/invoice.paid").json()["Version"] == 2


def test_an_openapi_3_0_document_with_x_webhooks_in_yaml(make, api):
    make.basics()
    document = {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": {},
                "x-webhooks": {"user.created": {"post": {"requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {"nickname": {"type": "string", "nullable": True},
                                                     "age": {"type": "integer", "minimum": 0, "exclusiveMinimum": True}}},
                    "example": {"nickname": None, "age": 3}}}}, "responses": {"200": {"description": "ok"}}}}}}
    r = api.post("/channel/ch1/event-types/import", yaml.safe_dump(document), content_type="application/yaml")
    assert r.status_code == 200 and r.json()["Created"] == 1, r.content
    schema = api.get("/channel/ch1/event-type/user.created").json()["Schema"]
    assert schema["properties"]["nickname"]["type"] == ["string", "null"]
    assert schema["properties"]["age"] == {"type": "integer", "exclusiveMinimum": 0}
    assert make.publish(body=b'{"nickname": null, "age": 1}', HTTP_X_BROKER_MESSAGE_TYPE="user.created").status_code == 201
    assert make.publish(body=b'{"age": 0}', HTTP_X_BROKER_MESSAGE_TYPE="user.created").status_code == 422


@pytest.mark.parametrize(("document", "code"), [
    ({"swagger": "2.0"}, "invalid_document"),
    ({"openapi": "3.1.0", "info": {}, "paths": {}}, "invalid_document"),
    ({"openapi": "4.0.0", "webhooks": {"a": {}}}, "invalid_document"),
    ({"openapi": "3.1.0", "webhooks": {"a.b": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"type": "nonsense"}}}}}}}}, "invalid_schema"),
    ({"openapi": "3.1.0", "webhooks": {"a.b": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"$ref": "other.yaml#/Thing"}}}}}}}}, "invalid_schema"),
    ({"openapi": "3.1.0", "webhooks": {"a.b": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Missing"}}}}}}}}, "invalid_document"),
])
def test_a_document_that_cannot_be_imported_changes_nothing(make, api, document, code):
    make.basics()
    if code == "invalid_schema":  # a good webhook before the bad one is not kept either
        document["webhooks"] = {"good.one": {"post": {}}, **document["webhooks"]}
    r = post_import(api, document)
    assert r.status_code == 400 and r.json()["error"] == code, r.content
    assert not EventType.objects.exists()
    r = api.post("/channel/ch1/event-types/import", b"{not json", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"] == "invalid_document"


def test_an_example_that_does_not_validate_is_left_out_with_a_warning(make, api):
    make.basics()
    document = {"openapi": "3.1.0", "webhooks": {"a.b": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"type": "object", "required": ["x"]}, "example": {"y": 1}}}}}}}}
    body = post_import(api, document).json()
    assert body["Created"] == 1 and body["Warnings"][0]["Type"] == "a.b"
    assert api.get("/channel/ch1/event-type/a.b").json()["Example"] is None


def test_the_brokers_own_schema_imports_into_another_channel(make, api):
    make.basics()
    make.channel("ch2", token="ch2-token")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "next": {"$ref": "#"}}}
    api.put("/channel/ch1/event-type/tick", {"schema": schema, "description": "A tick."}, format="json")
    api.put("/channel/ch1/event-type/tock", {"deprecated": True}, format="json")
    document = api.get("/api/schema/?format=json").json()
    body = post_import(api, document, channel="ch2").json()
    assert body["Created"] == 2 and body["Skipped"] == [], body
    tick = api.get("/channel/ch2/event-type/tick").json()
    assert tick["Schema"] == schema and tick["Description"] == "A tick."
    assert api.get("/channel/ch2/event-type/tock").json()["Deprecated"] is True


def test_importing_needs_the_admin_token(make, api):
    make.basics()
    r = APIClient().post("/channel/ch1/event-types/import", json.dumps(document_31()), content_type="application/json",
                         HTTP_X_BROKER_CHANNEL_TOKEN="ch-token")
    assert r.status_code == 401
    assert post_import(api, document_31(), channel="nope").status_code == 404
