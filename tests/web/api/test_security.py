"""Security: HMAC request signing, constant-time token checks, tokens kept out of logs."""

from __future__ import annotations

import base64
import inspect
import logging
import time

import pytest
from rest_framework.test import APIClient

from broker import tokens as auth
from web.middleware import signature_make

pytestmark = pytest.mark.django_db
SECRET = base64.b64encode(b"s" * 32).decode()


@pytest.fixture
def hmac_on(settings):
    settings.BROKER_HMAC_SECRET = SECRET
    settings.BROKER_HMAC_TOLERANCE = 300


def signed(body: bytes, t: int | None = None, secret: bytes = b"s" * 32) -> str:
    t = int(time.time()) if t is None else t
    return f"t={t},v1={signature_make(secret, t, body)}"


def publish(body, **headers):
    return APIClient().generic("POST", "/channel/ch1/broadcast", body, content_type="text/plain",
                               HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                               HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)


def test_hmac_signing(world, hmac_on):
    assert APIClient().get("/_status").status_code == 200, "exempt path"
    missing = publish(b"x")
    assert missing.status_code == 401 and missing.json()["error"] == "signature_required"
    assert publish(b"x", HTTP_X_BROKER_SIGNATURE="garbage").status_code == 401
    wrong = publish(b"x", HTTP_X_BROKER_SIGNATURE=signed(b"x", secret=b"o" * 32))
    assert wrong.status_code == 403 and wrong.json()["error"] == "signature_mismatch"
    stale = publish(b"x", HTTP_X_BROKER_SIGNATURE=signed(b"x", t=int(time.time()) - 600))
    assert stale.status_code == 403 and stale.json()["error"] == "signature_expired"
    tampered = publish(b"y", HTTP_X_BROKER_SIGNATURE=signed(b"x"))
    assert tampered.status_code == 403
    assert publish(b"x", HTTP_X_BROKER_SIGNATURE=signed(b"x")).status_code == 201
    # tokens are still checked after the signature
    bad_token = APIClient().generic("POST", "/channel/ch1/broadcast", b"z", content_type="text/plain",
                                    HTTP_X_BROKER_CHANNEL_TOKEN="nope", HTTP_X_BROKER_PRODUCER_ID="p1",
                                    HTTP_X_BROKER_PRODUCER_TOKEN="p-token", HTTP_X_BROKER_SIGNATURE=signed(b"z"))
    assert bad_token.status_code == 403


def test_token_comparison_is_constant_time():
    source = inspect.getsource(auth.tokens_equal)
    assert "compare_digest" in source
    assert auth.tokens_equal("abc", "abc") and not auth.tokens_equal("abc", "abd")
    assert not auth.tokens_equal(None, "abc") and not auth.tokens_equal("", "")


def test_tokens_and_payloads_never_logged(world, caplog):
    with caplog.at_level(logging.DEBUG):
        world.publish(body=b"secret-payload-123", HTTP_X_BROKER_MESSAGE_ID="m-log")
        world.publish(channel_token="wrong-token-xyz")
        APIClient().get("/channels", HTTP_X_BROKER_ADMIN_TOKEN="bad-admin-token")
    text = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("ch-token", "p-token", "wrong-token-xyz", "bad-admin-token", "secret-payload-123",
                   "test-admin-token"):
        assert secret not in text
