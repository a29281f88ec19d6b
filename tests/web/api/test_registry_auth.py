"""Registry auth in webhook-broker's model: under HMAC gateway auth a validly signed request is
accepted on the registry endpoints without the admin token; BROKER_REGISTRY_AUTH=open opens them
(with a start-up warning); everything else keeps its credentials."""

from __future__ import annotations

import base64
import time
from urllib.parse import urlencode

import pytest
import requests
from rest_framework.test import APIClient

from tests.processes import start_web
from tests.system.hardening.test_secure_defaults import settings_in_subprocess
from web.middleware import signature_make

SECRET = b"r" * 32
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def hmac_on(settings):
    settings.BROKER_HMAC_SECRET = base64.b64encode(SECRET).decode()
    settings.BROKER_HMAC_TOLERANCE = 300


def signature(body: bytes, secret: bytes = SECRET, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    return f"t={t},v1={signature_make(secret, t, body)}"


def call(method: str, path: str, body: bytes = b"", **headers):
    """A request without the admin token (a webhook-broker client)."""
    return APIClient().generic(method, path, body, content_type=FORM, **headers)


def signed(method: str, path: str, fields: dict | None = None, **headers):
    body = urlencode(fields or {}).encode()
    return call(method, path, body, HTTP_X_BROKER_SIGNATURE=signature(body), **headers)


@pytest.mark.django_db
def test_signed_requests_use_the_registry_without_the_admin_token(hmac_on):
    r = signed("PUT", "/producer/wp", {"token": "wp-token"})
    assert r.status_code == 200 and r.json()["Token"] == "wp-token"
    assert signed("PUT", "/channel/wc", {"token": "wc-token"}).status_code == 200
    r = signed("PUT", "/channel/wc/consumer/wk", {"token": "wk-token", "callbackUrl": "http://127.0.0.1:9/x"})
    assert r.status_code == 200 and r.json()["Type"] == "push"
    got = signed("GET", "/channel/wc/consumer/wk")
    assert got.status_code == 200 and got.json()["Token"] == "wk-token", "as the admin sees it"
    assert signed("GET", "/producers").json()["Result"] == ["/producer/wp"]
    assert signed("GET", "/channels").status_code == 200 and signed("GET", "/channel/wc").status_code == 200
    assert signed("GET", "/channel/wc/consumers").json()["Result"] == ["/channel/wc/consumer/wk"]
    assert signed("GET", "/dlq-status").status_code == 200 and signed("GET", "/job-status").status_code == 200
    since = signed("GET", "/producer/wp")["Last-Modified"]
    assert signed("PUT", "/producer/wp", {"name": "Renamed"}).status_code == 400, "updates still need a precondition"
    update = signed("PUT", "/producer/wp", {"name": "Renamed"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert update.status_code == 200 and update.json()["Name"] == "Renamed"
    gone = signed("DELETE", "/channel/wc/consumer/wk", HTTP_IF_UNMODIFIED_SINCE=got["Last-Modified"])
    assert gone.status_code == 204


@pytest.mark.django_db
def test_unsigned_or_badly_signed_registry_requests_are_refused(world, hmac_on):
    missing = call("GET", "/producers")
    assert missing.status_code == 401 and missing.json()["error"] == "signature_required"
    body = urlencode({"token": "x"}).encode()
    wrong = call("PUT", "/producer/evil", body, HTTP_X_BROKER_SIGNATURE=signature(body, secret=b"o" * 32))
    assert wrong.status_code == 403 and wrong.json()["error"] == "signature_mismatch"
    stale = call("PUT", "/producer/evil", body, HTTP_X_BROKER_SIGNATURE=signature(body, t=int(time.time()) - 900))
    assert stale.status_code == 403 and stale.json()["error"] == "signature_expired"
    other = urlencode({"token": "y"}).encode()
    assert call("PUT", "/producer/evil", other, HTTP_X_BROKER_SIGNATURE=signature(body)).status_code == 403
    from broker.models import Producer

    assert not Producer.objects.filter(producer_id="evil").exists()
    # the signature opens the registry only: the broker's own admin operations keep the admin token
    r = signed("POST", "/channel/ch1/consumer/c1/pause")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert signed("POST", "/channel/ch1/consumer/c1/rotate-secret").status_code == 401


@pytest.mark.django_db
def test_without_hmac_the_registry_needs_the_admin_token(world):
    body = urlencode({"token": "t"}).encode()
    forged = call("PUT", "/producer/p5", body, HTTP_X_BROKER_SIGNATURE=signature(body))
    assert forged.status_code == 401, "a signature means nothing when signing is off"
    assert call("GET", "/producers").status_code == 401


@pytest.mark.django_db
def test_open_registry(settings, world):
    settings.BROKER_REGISTRY_AUTH = "open"
    r = call("PUT", "/producer/gw", urlencode({"token": "gw-token"}).encode())
    assert r.status_code == 200
    assert call("GET", "/producers").status_code == 200 and call("GET", "/dlq-status").status_code == 200
    assert call("GET", "/channel/ch1/consumer/c1").json()["Token"] == "c-token"
    # not the broker's own admin operations, nor anything guarded by per-object tokens
    assert call("POST", "/channel/ch1/consumer/c1/pause").status_code == 401
    assert call("GET", "/channel/ch1/messages").status_code == 401
    assert call("POST", "/channel/ch1/broadcast", b"x").status_code == 403


def test_registry_auth_setting_is_checked(tmp_path):
    bad = settings_in_subprocess(tmp_path, DJANGO_SECRET_KEY="k" * 50, BROKER_REGISTRY_AUTH="sometimes")
    assert bad.returncode != 0 and "BROKER_REGISTRY_AUTH must be token or open" in bad.stderr
    assert settings_in_subprocess(tmp_path, DJANGO_SECRET_KEY="k" * 50, BROKER_REGISTRY_AUTH="OPEN").returncode == 0


@pytest.mark.django_db(transaction=True)
def test_open_registry_warns_at_start_up(tmp_path):
    web = start_web(tmp_path, BROKER_REGISTRY_AUTH="open")
    try:
        assert requests.get(f"{web.url}/producers", timeout=10).status_code == 200
        assert "WARNING" in web.output() and "BROKER_REGISTRY_AUTH=open" in web.output()
    finally:
        web.stop()
    quiet = start_web(tmp_path)
    try:
        assert requests.get(f"{quiet.url}/producers", timeout=10).status_code == 401
        assert "BROKER_REGISTRY_AUTH" not in quiet.output()
    finally:
        quiet.stop()
