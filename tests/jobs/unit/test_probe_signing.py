"""A test event is signed as a callback: one ``v1,`` signature per secret in ``webhook-signature``,
the previous secret's only while its grace period lasts, each verifiable by the standardwebhooks
package on its own."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from jobs.callbacks.probe import probe_request
from jobs.callbacks.signing import secret_bytes, signature_headers
from jobs.callbacks.target import Target

OLD = "whsec_" + base64.b64encode(b"o" * 24).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 24).decode()


def target(previous_expires: float | None) -> Target:
    return Target(pk=1, consumer_id="c1", channel_id="ch1", url="https://receiver.example/hook?x=1", token="c-token",
                  secret=secret_bytes(NEW), previous_secret=secret_bytes(OLD), previous_expires=previous_expires,
                  timeout=2.0, max_retry=None, backoff=None, rate=None, updated_at=None)


def test_signature_headers_carry_one_signature_per_key():
    headers = signature_headers(keys=[b"k1", b"k2"], webhook_id="msg_1", timestamp=1700000000, body=b"{}")
    assert headers["webhook-id"] == "msg_1" and headers["webhook-timestamp"] == "1700000000"
    first, second = headers["webhook-signature"].split(" ")
    assert first.startswith("v1,") and second.startswith("v1,") and first != second


def test_during_the_grace_period_both_secrets_verify_the_test_event():
    now = time.time()
    headers, body = probe_request(target(previous_expires=now + 3600), now=now)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):
        event = Webhook(secret).verify(body, headers)
        assert event["type"] == "broker.test" and (event["channel"], event["consumer"]) == ("ch1", "c1")
    assert headers["X-Broker-Event"] == "test" and headers["webhook-id"].startswith("test_")
    assert headers["X-Broker-Consumer-Token"] == "c-token"
    assert datetime.fromisoformat(json.loads(body)["timestamp"]).tzinfo == timezone.utc


def test_after_the_grace_period_only_the_new_secret_verifies():
    now = time.time()
    headers, body = probe_request(target(previous_expires=now - 1), now=now)
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert Webhook(NEW).verify(body, headers)["type"] == "broker.test"
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(body, headers)
