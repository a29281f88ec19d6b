"""Fixtures of the sources tests: a channel with a push and a pull consumer, sources made through
the API, and requests signed as each provider signs them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from rest_framework.test import APIClient

from sources.lookup import sources_cache_clear
from sources.tallies import source_tallies_close
from tests.jobs.conftest import dispatcher, push_settings, push_world, receiver  # noqa: F401  (push fixtures)
from tests.jobs.pull.conftest import _stop_wakeup_listener  # noqa: F401

GITHUB_SECRET = "It's a Secret to Everybody"


@pytest.fixture(autouse=True)
def _close_source_tally(django_db_blocker):
    """Requests outside a test transaction (a live server's) start this process's tally thread
    (sources.tallies): write what it holds and stop it at the test's end, while the test's database
    may still be used. Left running, it wrote a second later into the next test, where pytest-django
    refuses database access, and its traceback upset a parse in another test (tests/source_ast.py)."""
    yield
    with django_db_blocker.unblock():
        source_tallies_close()


@pytest.fixture(autouse=True)
def _fresh_source_cache():
    """Each test reads its sources anew (the cache outlives a test's rolled-back rows)."""
    sources_cache_clear()
    yield
    sources_cache_clear()


def github_headers(body: bytes, secret: str = GITHUB_SECRET, *, delivery: str = "d-1", event: str = "push") -> dict:
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": signature, "X-GitHub-Delivery": delivery, "X-GitHub-Event": event}


def stripe_headers(body: bytes, secret: str, *, at: int | None = None) -> dict:
    stamp = int(time.time()) if at is None else at
    signature = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={stamp},v1={signature}"}


def shopify_headers(body: bytes, secret: str, *, webhook_id: str = "w-1", topic: str = "orders/create") -> dict:
    digest = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    return {"X-Shopify-Hmac-Sha256": digest, "X-Shopify-Webhook-Id": webhook_id, "X-Shopify-Topic": topic}


def slack_headers(body: bytes, secret: str, *, at: int | None = None) -> dict:
    stamp = int(time.time()) if at is None else at
    signature = "v0=" + hmac.new(secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(stamp), "X-Slack-Signature": signature}


def meta(headers: dict) -> dict:
    """Django test-client keywords for request headers (Content-Type goes as content_type)."""
    return {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}


class Sources:
    """Sources of channel ch1 through the API, and requests to their addresses."""

    def __init__(self, api) -> None:
        self.api = api
        self.anon = APIClient()

    def put(self, name: str = "gh", channel: str = "ch1", **fields):
        return self.api.put(f"/channel/{channel}/source/{name}", fields, format="json")

    def make(self, name: str = "gh", channel: str = "ch1", **fields) -> dict:
        fields.setdefault("verify", "github")
        if fields["verify"] != "none":
            fields.setdefault("secret", GITHUB_SECRET)
        r = self.put(name, channel, **fields)
        assert r.status_code == 201, r.content
        return r.json()

    def post(self, source: dict | str, body: bytes, headers: dict | None = None,
             content_type: str = "application/json"):
        source_id = source if isinstance(source, str) else source["ID"]
        return self.anon.generic("POST", f"/in/{source_id}", body, content_type=content_type, **meta(headers or {}))

    def github(self, source: dict, body: bytes = b'{"zen": "hi"}', *, delivery: str = "d-1", event: str = "push",
               secret: str = GITHUB_SECRET):
        return self.post(source, body, github_headers(body, secret, delivery=delivery, event=event))


@pytest.fixture
def sources(api, world):
    """Channel ch1 with push consumer c1 and pull consumer c2 (``world``), and the sources helper."""
    return Sources(api)


def json_body(response) -> dict:
    return json.loads(response.content)
