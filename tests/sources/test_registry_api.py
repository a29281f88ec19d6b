"""The sources registry over HTTP: PUT creates (201) or updates (200), GET never shows the secret,
DELETE (204), the channel's list; the address (URL) on the public base URL, the id random and
stable; the fields' refusals; who may call it."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from sources.models import Source
from tests.conftest import ADMIN_TOKEN
from tests.sources.conftest import GITHUB_SECRET

pytestmark = pytest.mark.django_db


def entropy_bits(text: str) -> float:
    """64 symbols: 6 bits each (token_urlsafe)."""
    return len(text) * math.log2(64)


def test_put_creates_then_updates_and_the_id_stays(sources):
    r = sources.put("gh", verify="github", secret=GITHUB_SECRET)
    assert r.status_code == 201, r.content
    body = r.json()
    assert r["Location"] == "/channel/ch1/source/gh" and r["Last-Modified"]
    assert body["Name"] == "gh" and body["ChannelID"] == "ch1" and body["Verify"] == "github"
    assert body["Secret"] == GITHUB_SECRET  # the answer that set it shows it, once
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", body["ID"]) and entropy_bits(body["ID"]) >= 128
    assert body["URL"] == f"http://testserver/in/{body['ID']}"
    assert body["Dedupe"] == "header:X-GitHub-Delivery" and body["MessageType"] == "header:X-GitHub-Event"
    assert body["DedupeWindow"] == "3d" and body["ResponseStatus"] == 200 and body["Enabled"] is True

    r = sources.put("gh", dedupeWindow="12h", responseStatus=202, responseBody="ok")
    assert r.status_code == 200, r.content
    again = r.json()
    assert again["ID"] == body["ID"] and again["URL"] == body["URL"]
    assert again["DedupeWindow"] == "12h" and again["ResponseStatus"] == 202 and "Secret" not in again

    got = sources.api.get("/channel/ch1/source/gh")
    assert got.status_code == 200 and got.json()["ID"] == body["ID"]
    assert "Secret" not in got.json() and GITHUB_SECRET not in got.content.decode()
    assert got.json()["SecretSet"] is True and got.json()["Counts"]["accepted"] == 0


def test_ids_are_random(sources):
    ids = [sources.make(f"s{i}")["ID"] for i in range(5)]
    assert len(set(ids)) == 5
    assert max(Counter("".join(ids)).values()) < 20  # not a counter or a timestamp


def test_url_on_the_public_base_url(sources, settings):
    settings.BROKER_PUBLIC_URL = "https://hooks.example.com/broker"
    body = sources.make("gh")
    assert body["URL"] == f"https://hooks.example.com/broker/in/{body['ID']}"
    settings.BROKER_PUBLIC_URL, settings.BROKER_PORTAL_URL = "", "https://old.example.com"  # its earlier name
    assert sources.api.get("/channel/ch1/source/gh").json()["URL"] == f"https://old.example.com/in/{body['ID']}"


def test_form_fields_like_the_other_registry_puts(api, world):
    r = api.put("/channel/ch1/source/st", {"verify": "stripe", "secret": "whsec_abc", "dedupeWindow": "7d"})
    assert r.status_code == 201, r.content
    assert r.json()["Dedupe"] == "json:id" and r.json()["MessageType"] == "json:type" and r.json()["DedupeWindow"] == "7d"


def test_list_and_delete(sources):
    first, second = sources.make("a"), sources.make("b")
    r = sources.api.get("/channel/ch1/sources")
    assert r.status_code == 200 and set(r.json()["Result"]) == {"/channel/ch1/source/a", "/channel/ch1/source/b"}
    assert sources.api.delete("/channel/ch1/source/a").status_code == 204
    assert sources.api.get("/channel/ch1/source/a").status_code == 404
    assert sources.api.delete("/channel/ch1/source/a").status_code == 404
    assert sources.post(first, b"{}").status_code == 404
    assert sources.github(second).status_code == 200
    assert sources.api.get("/channel/ch9/sources").status_code == 404


@pytest.mark.parametrize(("fields", "code"), [
    ({}, "verify_required"),
    ({"verify": "gitlab", "secret": "x"}, "invalid_verify"),
    ({"verify": "github"}, "secret_required"),
    ({"verify": "hmac", "secret": "x"}, "signature_header_required"),
    ({"verify": "standard-webhooks", "secret": "not base64!"}, "invalid_secret"),
    ({"verify": "basic", "secret": "no-colon"}, "invalid_secret"),
    ({"verify": "github", "secret": "x", "dedupeWindow": "31d"}, "invalid_dedupeWindow"),
    ({"verify": "github", "secret": "x", "dedupe": "cookie:x"}, "invalid_dedupe"),
    ({"verify": "github", "secret": "x", "messageType": "value:not a type"}, "invalid_messageType"),
    ({"verify": "github", "secret": "x", "responseStatus": 301}, "invalid_responseStatus"),
    ({"verify": "github", "secret": ["x"]}, "invalid_field"),
])
def test_refusals(sources, fields, code):
    r = sources.put("gh", **fields)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == code and r.json()["detail"]
    assert not Source.objects.exists()


def test_a_changed_verify_needs_a_new_secret(sources):
    sources.make("gh")
    r = sources.put("gh", verify="stripe")
    assert r.status_code == 400 and r.json()["error"] == "secret_required"
    r = sources.put("gh", verify="stripe", secret="whsec_new")
    assert r.status_code == 200 and r.json()["Dedupe"] == "json:id"
    assert sources.put("gh", verify="none").status_code == 200


def test_names_and_channels(sources):
    assert sources.put("a b", verify="none").status_code in (400, 404)
    assert sources.put("gh", channel="nope", verify="none").status_code == 404


def test_if_unmodified_since_when_given(sources):
    sources.make("gh")
    r = sources.api.put("/channel/ch1/source/gh", {"responseBody": "x"}, format="json",
                        HTTP_IF_UNMODIFIED_SINCE="Mon, 01 Jan 2001 00:00:00 GMT")
    assert r.status_code == 412 and r.json()["error"] == "precondition_failed"


def test_registry_needs_the_admin_token(sources, client_anon):
    sources.make("gh")
    assert client_anon.get("/channel/ch1/source/gh").status_code == 401
    assert client_anon.get("/channel/ch1/source/gh", HTTP_X_BROKER_ADMIN_TOKEN="wrong").status_code == 403
    assert client_anon.put("/channel/ch1/source/x", {"verify": "none"}, format="json").status_code == 401
    assert client_anon.delete("/channel/ch1/source/gh").status_code == 401
    assert client_anon.get("/channel/ch1/sources").status_code == 401
    assert client_anon.get("/channel/ch1/source/gh", HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).status_code == 200


def test_secret_rotation_keeps_the_previous_one_for_the_grace(sources, settings):
    settings.BROKER_SECRET_ROTATION_GRACE = 3600
    source = sources.make("gh")
    r = sources.put("gh", secret="new-secret")
    assert r.status_code == 200 and r.json()["Secret"] == "new-secret" and r.json()["PreviousSecretValidUntil"]
    assert sources.github(source, delivery="a").status_code == 200  # the old one, within the grace
    assert sources.github(source, delivery="b", secret="new-secret").status_code == 200
    assert sources.github(source, delivery="c", secret="third").status_code == 401
    settings.BROKER_SECRET_ROTATION_GRACE = 0
    sources.put("gh", secret="newer-secret")
    assert sources.github(source, delivery="d", secret="new-secret").status_code == 401
    assert sources.github(source, delivery="e", secret="newer-secret").status_code == 200
