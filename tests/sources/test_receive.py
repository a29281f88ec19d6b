"""``POST /in/{id}``: each preset end to end (verified, one message on the channel with the body byte
for byte, its Content-Type, the type, X-Broker-Source and X-Broker-Source-Delivery), refusals that
store nothing, redeliveries, Slack's URL check, trace context, the pull consumer's view, the body
over the maximum, a disabled or unknown source, and the counts by outcome."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from standardwebhooks.webhooks import Webhook

from broker.models import Message
from jobs.models import Job
from sources.models import SourceDelivery
from sources.tallies import source_counts
from tests.jobs.pull.conftest import PullClient
from tests.sources.conftest import (GITHUB_SECRET, github_headers, shopify_headers, slack_headers, stripe_headers)

pytestmark = pytest.mark.django_db


def only_message() -> Message:
    messages = list(Message.objects.all())
    assert len(messages) == 1, messages
    return messages[0]


def test_github_push_becomes_one_message_for_every_consumer(sources):
    source = sources.make("gh")
    body = b'{"ref": "refs/heads/main",  "zen": "Keep it logically awesome."}\n'
    r = sources.post(source, body, github_headers(body, delivery="72d3162e", event="push"))
    assert r.status_code == 200 and r.content == b""
    message = only_message()
    assert bytes(message.payload) == body and message.content_type == "application/json"
    assert message.type == "push" and message.producer.producer_id == "broker-sources"
    assert message.headers == {"X-Broker-Source": "gh", "X-Broker-Source-Delivery": "72d3162e"}
    assert Job.objects.filter(message=message).count() == 2  # push c1 and pull c2

    [job] = PullClient(sources.anon).pull(batch=5).json()["Result"]
    assert job["Message"]["Source"] == "gh" and job["Message"]["SourceDelivery"] == "72d3162e"
    assert job["Message"]["Payload"] == body.decode() and job["Type"] == "push"


def test_a_redelivery_answers_the_same_and_publishes_nothing(sources):
    source = sources.make("gh", responseStatus=202, responseBody='{"ok": true}', responseContentType="application/json")
    first = sources.github(source, delivery="d-1")
    second = sources.github(source, delivery="d-1")
    other = sources.github(source, delivery="d-2")
    for r in (first, second, other):
        assert r.status_code == 202 and r.content == b'{"ok": true}' and r["Content-Type"] == "application/json"
    assert Message.objects.count() == 2
    assert SourceDelivery.objects.count() == 2
    counts = source_counts()[int(source_pk(source))]
    assert counts["accepted"] == 2 and counts["duplicate"] == 1


def source_pk(source: dict) -> int:
    from sources.models import Source

    return Source.objects.get(source_id=source["ID"]).pk


def test_any_accept_header(sources):
    source = sources.make("gh")
    body = b"{}"
    headers = {**github_headers(body), "Accept": "*/*; q=0.5, application/xml"}
    assert sources.post(source, body, headers).status_code == 200
    r = sources.post(source, body, {"Accept": "application/xml"})
    assert r.status_code == 401 and r.json()["error"] == "signature_missing"


def test_the_window_expires(sources):
    source = sources.make("gh", dedupeWindow="1s")
    assert sources.github(source, delivery="d-1").status_code == 200
    SourceDelivery.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert sources.github(source, delivery="d-1").status_code == 200
    assert Message.objects.count() == 2  # outside the window: a new delivery


def test_dedupe_none_and_body(sources):
    none = sources.make("plain", verify="none", dedupe="none")
    assert sources.post(none, b"x").status_code == 200 and sources.post(none, b"x").status_code == 200
    hashed = sources.make("hashed", verify="none", dedupe="body")
    assert sources.post(hashed, b"x").status_code == 200 and sources.post(hashed, b"x").status_code == 200
    assert sources.post(hashed, b"y").status_code == 200
    assert Message.objects.count() == 4
    assert Message.objects.filter(headers__has_key="X-Broker-Source-Delivery").count() == 2


def test_bad_and_missing_signatures_store_nothing(sources):
    source = sources.make("gh")
    body = b'{"zen": "hi"}'
    wrong = sources.post(source, body, github_headers(body, "wrong secret"))
    missing = sources.post(source, body, {"X-GitHub-Delivery": "d-9"})
    assert (wrong.status_code, wrong.json()["error"]) == (401, "signature_invalid")
    assert (missing.status_code, missing.json()["error"]) == (401, "signature_missing")
    assert not Message.objects.exists() and not SourceDelivery.objects.exists()
    got = sources.api.get("/channel/ch1/source/gh").json()
    assert got["Counts"]["refused"] == {"signature_invalid": 1, "signature_missing": 1}
    assert [r["Reason"] for r in got["LastRefusals"]] == ["signature_missing", "signature_invalid"]


def test_stripe_with_its_tolerance(sources):
    secret = "whsec_test_abc"
    source = sources.make("st", verify="stripe", secret=secret)
    event = json.dumps({"id": "evt_1", "type": "invoice.paid", "object": "event"}).encode()
    assert sources.post(source, event, stripe_headers(event, secret)).status_code == 200
    assert sources.post(source, event, stripe_headers(event, secret)).status_code == 200  # the same event id
    stale = sources.post(source, event, stripe_headers(event, secret, at=int(time.time()) - 301))
    assert (stale.status_code, stale.json()["error"]) == (401, "timestamp_out_of_tolerance")
    message = only_message()
    assert message.type == "invoice.paid" and message.headers["X-Broker-Source-Delivery"] == "evt_1"


def test_shopify(sources):
    source = sources.make("shop", verify="shopify", secret="hush")
    body = b'{"id": 1}'
    assert sources.post(source, body, shopify_headers(body, "hush", webhook_id="w-1")).status_code == 200
    assert sources.post(source, body, shopify_headers(body, "hush", webhook_id="w-1")).status_code == 200
    message = only_message()
    assert message.type == "orders/create" and message.headers["X-Broker-Source-Delivery"] == "w-1"


def test_slack_url_check_and_events(sources):
    secret = "8f742231b10e8888abcd99yyyzzz85a5"
    source = sources.make("sl", verify="slack", secret=secret)
    check = json.dumps({"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                        "type": "url_verification"}).encode()
    r = sources.post(source, check, slack_headers(check, secret))
    assert r.status_code == 200 and r.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    assert not Message.objects.exists()
    unsigned = sources.post(source, check, {})
    assert unsigned.status_code == 401 and not Message.objects.exists()
    event = json.dumps({"type": "event_callback", "event_id": "Ev08", "event": {"type": "app_mention"}}).encode()
    assert sources.post(source, event, slack_headers(event, secret)).status_code == 200
    stale = sources.post(source, event, slack_headers(event, secret, at=int(time.time()) - 400))
    assert stale.json()["error"] == "timestamp_out_of_tolerance"
    message = only_message()
    assert message.type == "app_mention" and message.headers["X-Broker-Source-Delivery"] == "Ev08"


def test_standard_webhooks(sources):
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    source = sources.make("sw", verify="standard-webhooks", secret=secret)
    body = json.dumps({"type": "contact.created", "data": {"id": 1}}).encode()
    stamp = datetime.now(tz=timezone.utc)
    headers = {"webhook-id": "msg_2K", "webhook-timestamp": str(int(stamp.timestamp())),
               "webhook-signature": Webhook(secret).sign("msg_2K", stamp, body.decode())}
    assert sources.post(source, body, headers).status_code == 200
    assert sources.post(source, body, headers).status_code == 200
    message = only_message()
    assert message.type == "contact.created" and message.headers["X-Broker-Source-Delivery"] == "msg_2K"


def test_any_content_type_byte_for_byte(sources):
    source = sources.make("raw", verify="api-key", secret="k-1", messageType="value:raw.blob")
    body = bytes(range(256))
    r = sources.post(source, body, {"X-API-Key": "k-1"}, content_type="application/x-custom; v=1")
    assert r.status_code == 200
    message = only_message()
    assert bytes(message.payload) == body and message.content_type == "application/x-custom; v=1"
    assert message.type == "raw.blob"


def test_traceparent_continues_into_the_message(sources):
    source = sources.make("gh")
    body = b"{}"
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = sources.post(source, body, {**github_headers(body), "traceparent": parent})
    assert r.status_code == 200
    assert only_message().traceparent.split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_body_over_the_maximum_is_413_and_stores_nothing(sources, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 1000
    source = sources.make("gh")
    body = b"x" * 1001
    r = sources.post(source, body, github_headers(body))
    assert (r.status_code, r.json()["error"]) == (413, "payload_too_large")
    assert not Message.objects.exists()
    body = b"x" * 1000
    assert sources.post(source, body, github_headers(body)).status_code == 200


def test_unknown_disabled_and_invalid_type(sources):
    assert sources.post("x" * 32, b"{}").status_code == 404
    assert sources.post("not/an/id", b"{}").status_code == 404
    source = sources.make("gh")
    assert sources.put("gh", enabled=False).status_code == 200
    r = sources.github(source)
    assert (r.status_code, r.json()["error"]) == (403, "source_disabled")
    sources.put("gh", enabled=True)
    r = sources.github(source, event="not a type")
    assert (r.status_code, r.json()["error"]) == (400, "invalid_message_type")
    assert not Message.objects.exists()


def test_no_broker_token_is_needed_and_the_hmac_gateway_lets_it_through(sources, settings):
    source = sources.make("gh")
    settings.BROKER_HMAC_SECRET = "c2VjcmV0"  # base64 "secret": every other path now needs X-Broker-Signature
    assert sources.github(source).status_code == 200
    assert sources.anon.get("/channels").status_code == 401


def test_a_producer_cannot_pose_as_a_source(world):
    r = world.publish(**{"X-Broker-Metadata-Headers": "X-Broker-Source,x-broker-source-delivery,X-Tenant",
                         "X-Broker-Source": "gh", "x-broker-source-delivery": "d-1", "X-Tenant": "acme"})
    assert r.status_code == 201, r.content
    assert only_message().headers == {"X-Tenant": "acme"}


def test_metrics(sources):
    source = sources.make("gh")
    sources.github(source, delivery="a")
    sources.github(source, delivery="a")
    sources.post(source, b"{}", {})
    text = sources.anon.get("/metrics").content.decode()
    assert 'broker_source_requests_total{channel="ch1",outcome="accepted",source="gh"} 1.0' in text
    assert 'broker_source_requests_total{channel="ch1",outcome="duplicate",source="gh"} 1.0' in text
    assert 'broker_source_requests_total{channel="ch1",outcome="signature_missing",source="gh"} 1.0' in text


def test_a_database_that_cannot_serve_is_503_with_retry_after(sources, monkeypatch):
    from django.db import OperationalError

    from sources import receive

    source = sources.make("gh")

    def down(**kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(receive, "message_publish_grouped", down)
    r = sources.github(source)
    assert (r.status_code, r.json()["error"], r["Retry-After"]) == (503, "database_unavailable", "1")
    assert not Message.objects.exists()


def test_a_providers_event_is_held_to_the_channels_event_types(sources, api):
    schema = {"type": "object", "required": ["ref"], "properties": {"ref": {"type": "string"}}}
    r = api.put("/channel/ch1/event-type/push", {"schema": schema}, format="json")
    assert r.status_code in (200, 201), r.content
    source = sources.make("gh")
    good, bad = b'{"ref": "refs/heads/main"}', b'{"ref": 7}'
    assert sources.post(source, good, github_headers(good, delivery="a")).status_code == 200
    r = sources.post(source, bad, github_headers(bad, delivery="b"))
    assert (r.status_code, r.json()["error"], r.json()["path"]) == (422, "schema_validation_failed", "/ref")
    assert Message.objects.count() == 1
    assert sources.api.get("/channel/ch1/source/gh").json()["Counts"]["refused"] == {"schema_validation_failed": 1}


def test_the_adapter_without_django_answers_the_same(sources):
    from web.api.sources import source_receive_answer

    source = sources.make("gh", responseStatus=202, responseBody="ok")
    body = b"{}"
    headers = {k.lower(): v for k, v in github_headers(body).items()}
    assert source_receive_answer(source_id=source["ID"], headers=headers, body=body) == (
        202, "text/plain; charset=utf-8", b"ok", {})
    status, content_type, answer, extra = source_receive_answer(source_id=source["ID"], headers={}, body=body)
    assert (status, content_type, json.loads(answer)["error"], extra) == (401, "application/json",
                                                                         "signature_missing", {})
    assert source_receive_answer(source_id="nope", headers={}, body=body)[0] == 404
    assert Message.objects.count() == 1
