"""POST / DELETE /channel/{c}/consumer/{k}/portal-links over HTTP: the 201 shape, ttl and scope
rules, who may call it, revocation; what is stored of a link; the schema."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import Client

from consumers.models import Advisory
from web.portal.models import PortalLink, PortalSession
from tests.web.portal.conftest import C1, link_make, link_open, link_path

pytestmark = pytest.mark.django_db


def expires_in(body: dict) -> float:
    return (datetime.fromisoformat(body["ExpiresAt"].replace("Z", "+00:00")) - datetime.now(timezone.utc)).total_seconds()


def test_a_link_answers_201_with_its_url_expiry_and_scope(world, api):
    r = api.post(f"{C1}/portal-links")
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {"URL", "ExpiresAt", "Scope"} and body["Scope"] == "manage"
    assert body["URL"].startswith("http://testserver/portal/open/") and body["ExpiresAt"].endswith("Z")
    assert 3590 < expires_in(body) <= 3600  # default 1h
    assert r["Cache-Control"] == "no-store"
    token = body["URL"].rsplit("/", 1)[1]
    link = PortalLink.objects.get()
    assert link.created_by == "admin token" and link.scope == "manage"
    assert token not in link.token_hash and len(link.token_hash) == 64  # only a hash is stored

    body = link_make(api, ttl="30d", scope="read")  # JSON body
    assert body["Scope"] == "read" and 30 * 86400 - 10 < expires_in(body) <= 30 * 86400
    r = api.post(f"{C1}/portal-links", {"ttl": "90s", "scope": "manage"})  # form fields
    assert r.status_code == 201 and 80 < expires_in(r.json()) <= 90


def test_links_point_at_broker_portal_url_when_set(world, api, settings):
    settings.BROKER_PORTAL_URL = "https://broker.example.com"
    assert link_make(api)["URL"].startswith("https://broker.example.com/portal/open/")


@pytest.mark.parametrize(("data", "code"), [
    ({"ttl": "31d"}, "invalid_ttl"), ({"ttl": "2592001"}, "invalid_ttl"), ({"ttl": "0"}, "invalid_ttl"),
    ({"ttl": "soon"}, "invalid_ttl"), ({"ttl": 3.5}, "invalid_ttl"), ({"scope": "write"}, "invalid_scope"),
    ({"ttl": {"d": 1}}, "invalid_field"),
])
def test_bad_ttl_or_scope_is_a_400(world, api, data, code):
    r = api.post(f"{C1}/portal-links", data, format="json")
    assert r.status_code == 400 and r.json()["error"] == code, r.content
    assert not PortalLink.objects.exists()


def test_only_the_admin_token_or_staff_may_make_or_revoke_links(world, client_anon, admin_client):
    for method in (client_anon.post, client_anon.delete):
        r = method(f"{C1}/portal-links")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        r = method(f"{C1}/portal-links", HTTP_X_BROKER_ADMIN_TOKEN="wrong")
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        r = method(f"{C1}/portal-links", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_CONSUMER_TOKEN="c-token")
        assert r.status_code == 401  # the consumer's own tokens make no links
        r = method("/channel/ch1/consumer/nobody/portal-links")
        assert r.status_code == 401  # credentials first: nothing said about what exists
    assert not PortalLink.objects.exists()
    r = admin_client.post(f"{C1}/portal-links", {"scope": "read"})  # a staff session
    assert r.status_code == 201 and PortalLink.objects.get().created_by == "staff user admin"


def test_unknown_channel_or_consumer_is_a_404(world, api):
    assert api.post("/channel/ch1/consumer/nobody/portal-links").json()["error"] == "consumer_not_found"
    assert api.delete("/channel/nope/consumer/c1/portal-links").status_code == 404


def test_delete_revokes_every_link_and_session_of_the_consumer_at_once(world, api):
    first, second = link_make(api), link_make(api, scope="read")
    other = link_make(api, "/channel/ch1/consumer/c2")
    browser = Client()
    assert link_open(browser, first).status_code == 302
    assert browser.get("/portal/channel/ch1/consumer/c1/").status_code == 200

    assert api.delete(f"{C1}/portal-links").status_code == 204
    page = browser.get("/portal/channel/ch1/consumer/c1/")  # the open session ends at once
    assert page.status_code == 403 and b"revoked" in page.content
    for body in (first, second):
        r = Client().get(link_path(body))
        assert r.status_code == 403 and b"revoked" in r.content and "broker_portal" not in r.cookies
    assert Client().get(link_path(other)).status_code == 302  # another consumer's links stay
    assert PortalSession.objects.filter(revoked_at__isnull=False).count() == 1
    advisory = Advisory.objects.get(type="portal_links_revoked")
    assert advisory.consumer_id == "c1" and len(advisory.data["links"]) == 2 and advisory.data["by"] == "admin token"
    assert api.delete(f"{C1}/portal-links").status_code == 204  # nothing left: still 204


def test_an_expired_link_opens_nothing(world, api):
    body = link_make(api, ttl="1h")
    PortalLink.objects.update(expires_at=datetime.now(timezone.utc) - timedelta(seconds=1))
    r = Client().get(link_path(body))
    assert r.status_code == 403 and b"expired" in r.content


def test_the_schema_documents_both_operations(world, api):
    schema = api.get("/api/schema/?format=json").json()
    ops = schema["paths"]["/channel/{channel_id}/consumer/{consumer_id}/portal-links"]
    assert {"post", "delete"} <= set(ops)
    created = ops["post"]["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    component = schema["components"]["schemas"][created.rsplit("/", 1)[1]]
    assert set(component["required"]) == {"URL", "ExpiresAt", "Scope"}
    assert {"400", "401", "403", "404"} <= set(ops["post"]["responses"]) and "204" in ops["delete"]["responses"]
    body = ops["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"ttl", "scope"}


@pytest.mark.parametrize("body", [b'{"ttl": "1h", "sco', b'{"ttl": "\xff\xfe"}', b"[" * 50000 + b"]" * 50000,
                                  b'{"ttl": "1\\u0000h"}', b'["ttl"]', b"\x00\x01"])
def test_hostile_bodies_are_a_json_4xx(world, api, body):
    r = api.generic("POST", f"{C1}/portal-links", body, content_type="application/json")
    assert 400 <= r.status_code < 500 and {"error", "detail"} <= set(r.json()), (r.status_code, r.content[:200])
    assert not PortalLink.objects.exists()
