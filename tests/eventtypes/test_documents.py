"""The documents (issue 37 part 4), checked by the standard validators: the OpenAPI schema is 3.1
with every channel's event types as ``webhooks`` (openapi-spec-validator), and a channel's AsyncAPI
3.0 document (the AsyncAPI parser, ``@asyncapi/parser`` from npm, installed under tests/asyncapi by
.ci/run; without it the test is skipped outside CI and fails in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from openapi_spec_validator import validate as openapi_validate
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
PARSER = Path(__file__).resolve().parents[1] / "asyncapi"
ORDER = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"},
                                                            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
                                                            "parent": {"$ref": "#"}},
         "$defs": {"line": {"type": "object", "properties": {"sku": {"type": "string"}}}}}


def parser_missing() -> bool:
    return not ((PARSER / "node_modules" / "@asyncapi" / "parser").is_dir() and shutil.which("node"))


def asyncapi_check(document: dict, tmp_path: Path) -> list[dict]:
    """The AsyncAPI parser's verdict on ``document``: its JSON lines (the last one says ok)."""
    if parser_missing():
        if os.environ.get("CI"):
            pytest.fail("the AsyncAPI parser is not installed (npm ci --prefix tests/asyncapi, as .ci/run does)")
        # outside CI (which installs it and fails above without it) a developer may lack node/npm
        pytest.skip("the AsyncAPI parser (npm @asyncapi/parser) is not installed here, and this check needs "
                    "it: run npm ci --prefix tests/asyncapi (CI does, and fails without it)")
    path = tmp_path / "asyncapi.json"
    path.write_text(json.dumps(document))
    run = subprocess.run(["node", str(PARSER / "validate.mjs"), str(path)], capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0, run.stdout + run.stderr
    return lines


@pytest.fixture
def catalog(world, api):
    """ch1 with three event types: one with a schema using $defs and recursion, a deprecated one, one without a schema."""
    assert api.put("/channel/ch1/event-type/order.created", {"schema": ORDER, "description": "An order was placed.",
                                                             "example": {"id": 1, "lines": [{"sku": "a"}]}},
                   format="json").status_code == 200
    assert api.put("/channel/ch1/event-type/order/legacy:v1", {"schema": {"type": "object"}, "deprecated": True},
                   format="json").status_code == 200
    assert api.put("/channel/ch1/event-type/ping", {"description": "anything"}, format="json").status_code == 200
    return world


def test_the_openapi_schema_is_3_1_with_the_event_types_as_webhooks(catalog, api):
    document = api.get("/api/schema/?format=json").json()
    assert document["openapi"].startswith("3.1")
    openapi_validate(document)  # raises on any fault
    webhooks = document["webhooks"]
    assert set(webhooks) == {"ch1/order.created", "ch1/order/legacy:v1", "ch1/ping"}
    post = webhooks["ch1/order.created"]["post"]
    assert post["x-event-type"] == "order.created" and post["x-channel"] == "ch1" and post["deprecated"] is False
    media = post["requestBody"]["content"]["application/json"]
    assert media["example"] == {"id": 1, "lines": [{"sku": "a"}]}
    component = document["components"]["schemas"][media["schema"]["$ref"].rsplit("/", 1)[1]]
    base = media["schema"]["$ref"]
    assert component["properties"]["lines"]["items"]["$ref"] == f"{base}/$defs/line"  # refs moved with the schema
    assert component["properties"]["parent"]["$ref"] == base
    assert webhooks["ch1/order/legacy:v1"]["post"]["deprecated"] is True
    assert {p["name"] for p in post["parameters"]} >= {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert "webhookSignature" in document["components"]["securitySchemes"]


def test_the_asyncapi_document_passes_the_asyncapi_parser(catalog, api, tmp_path):
    r = APIClient().get("/channel/ch1/asyncapi.json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token")
    assert r.status_code == 200 and r["Content-Type"] == "application/json"
    document = r.json()
    assert document["asyncapi"] == "3.0.0"
    messages = document["components"]["messages"]
    assert {m["name"] for m in messages.values()} == {"order.created", "order/legacy:v1", "ping"}
    assert messages["order.created"]["examples"][0]["payload"] == {"id": 1, "lines": [{"sku": "a"}]}
    assert messages["order_legacy_v1"]["x-deprecated"] is True
    assert set(document["operations"]) == {"publish", "deliverPush", "deliverPull"}
    assert {"channelToken", "producerToken", "consumerToken", "webhookSignature"} <= set(
        document["components"]["securitySchemes"])
    verdict = asyncapi_check(document, tmp_path)
    assert verdict[-1]["ok"] and verdict[-1]["messages"] == 3 and verdict[-1]["operations"] == 3


def test_an_empty_channel_has_a_valid_asyncapi_document_too(world, api, tmp_path):
    document = api.get("/channel/ch1/asyncapi.json").json()
    assert document["components"]["messages"] == {}
    assert asyncapi_check(document, tmp_path)[-1]["ok"]


def test_the_asyncapi_parser_check_can_fail(world, api, tmp_path):
    """A document the parser refuses fails the check (a check that cannot fail proves nothing)."""
    document = api.get("/channel/ch1/asyncapi.json").json()
    document["operations"]["publish"]["action"] = "publish"  # AsyncAPI 2's word: not 3.0
    with pytest.raises(AssertionError):
        asyncapi_check(document, tmp_path)


def test_the_asyncapi_document_needs_the_channel_or_admin_token(world):
    client = APIClient()
    assert client.get("/channel/ch1/asyncapi.json").status_code == 401
    assert client.get("/channel/ch1/asyncapi.json", HTTP_X_BROKER_CHANNEL_TOKEN="wrong").status_code == 403
    assert client.get("/channel/none/asyncapi.json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token").status_code == 404
