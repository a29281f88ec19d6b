"""DB-free rules of the client: retry waits, Retry-After, batch items and bodies, job parsing with
opaque (xid) ids, ack answers, webhook verification, settings precedence. They come on top of
the tests against the real broker, never instead."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import datetime, timezone
from email.utils import formatdate

import pytest
from broker_client import RetryPolicy, WebhookVerificationError, verify_webhook
from broker_client.config import ConfigError, settings_load
from broker_client.consumer import PullConsumer, answer_error
from broker_client.http import retry_after_parse
from broker_client.producer import batch_item, body_encode

XID = "9m4e2mr0ui3e8a215n4g"  # 20 characters of [0-9a-v], as job ids look after the drop-in change


def test_retry_policy_honours_retry_after_up_to_max_wait_and_backs_off_without():
    policy = RetryPolicy(attempts=3, max_wait=5, backoff=0.5, max_backoff=2)
    assert policy.wait_for(1, 2.0) == 2.0
    assert policy.wait_for(1, 6.0) is None  # longer than max_wait: raise at once with retry_after
    assert policy.wait_for(4, 1.0) is None  # out of attempts
    waits = [policy.wait_for(n, None) for n in (1, 2, 3)]
    assert 0.4 <= waits[0] <= 0.6 and 0.8 <= waits[1] <= 1.2 and 1.6 <= waits[2] <= 2.4


def test_retry_after_parse():
    assert retry_after_parse("3") == 3.0
    assert retry_after_parse(None) is None and retry_after_parse("soon") is None
    later = retry_after_parse(formatdate(time.time() + 30, usegmt=True))
    assert 28 <= later <= 31


def test_bodies_and_batch_items():
    assert body_encode(b"\x00", None) == (b"\x00", "application/octet-stream")
    assert body_encode("é", None) == ("é".encode(), "text/plain; charset=utf-8")
    assert body_encode({"a": [1]}, None) == (b'{"a":[1]}', "application/json")
    assert body_encode("x", "text/csv") == (b"x", "text/csv")
    item = batch_item({"body": {"k": 1}, "message_id": "m1", "priority": 3, "partition_key": "p", "gate": 2,
                       "message_type": "order.created"})
    assert item == {"MessageID": "m1", "Payload": {"k": 1}, "ContentType": "application/json", "Priority": 3,
                    "PartitionKey": "p", "Gate": 2, "Type": "order.created"}
    generated = batch_item("text")
    assert len(generated["MessageID"]) == 32 and generated["Payload"] == "text"
    assert batch_item("text")["MessageID"] != generated["MessageID"]
    with pytest.raises(ValueError):
        batch_item(b"\xff")  # not UTF-8: the batch format is JSON
    with pytest.raises(ValueError):
        batch_item({"body": "x", "colour": "red"})


class _Response:
    def __init__(self, body, headers=None):
        self._body = body
        self.headers = headers or {}

    def json(self):
        return self._body


def test_jobs_keep_opaque_ids_and_decode_payloads():
    consumer = PullConsumer("http://127.0.0.1:1", "ch", "pc", "ct", "pt")
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    body = {"Result": [
        {"ID": XID, "Priority": 2, "Attempt": 3, "Deadline": "2030-01-01T00:00:30Z", "IncrementalTimeout": 0,
         "Message": {"MessageID": "0042", "Payload": base64.b64encode(b"\xff\x00").decode(),
                     "PayloadEncoding": "base64", "ContentType": "application/octet-stream",
                     "Headers": {"X-A": "1"}}, "PartitionKey": "k", "Gate": 1, "PinId": "pin1"},
        {"ID": "17", "Message": {"MessageID": "m", "Payload": "é"}},
    ]}
    jobs = consumer.jobs_parse(_Response(body, {"Date": formatdate(now.timestamp(), usegmt=True),
                                                "X-Broker-Pin-Id": "pin1"}))
    first, second = jobs
    assert first.id == XID and first.message_id == "0042"  # never parsed: "0042" keeps its zeros
    assert first.payload == b"\xff\x00" and first.attempt == 3 and first.headers == {"X-A": "1"}
    assert first.deadline == datetime(2030, 1, 1, 0, 0, 30, tzinfo=timezone.utc)
    assert (first.partition_key, first.gate, first.pin_id) == ("k", 1, "pin1") and consumer.pin_id == "pin1"
    assert 29 <= first._lease <= 30  # from the broker's Date, not this machine's clock
    assert second.id == "17" and second.payload == "é".encode() and second.attempt is None


def test_ack_answers():
    assert answer_error({"ID": XID, "Status": "DELIVERED", "RetryCount": 0}, "DELIVERED", False) is None
    # already in the state asked for (an earlier attempt landed): the outcome stands
    assert answer_error({"ID": XID, "Status": "DELIVERED", "Error": "conflict"}, "DELIVERED", False) is None
    error = answer_error({"ID": XID, "Status": "QUEUED", "Error": "conflict", "Detail": "job is not INFLIGHT"},
                         "DELIVERED", False)
    assert error.code == "conflict" and error.job_id == XID and error.job_status == "QUEUED"
    assert answer_error({"ID": XID, "Status": "QUEUED", "Error": "conflict"}, "DELIVERED", True) is None
    assert answer_error({"ID": XID, "Status": None, "Error": "not_found"}, "DEAD", True).code == "not_found"


SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()


def signed(body: bytes, *, stamp=None, msg_id="msg_1", key=b"k" * 24):
    stamp = int(time.time()) if stamp is None else stamp
    mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return {"Webhook-Id": msg_id, "Webhook-Timestamp": str(stamp),
            "Webhook-Signature": "v1," + base64.b64encode(mac).decode()}


def test_verify_webhook_rules():
    body = b'{"a": 1}'
    verify_webhook(signed(body), body, SECRET)  # header names in any case
    verify_webhook(signed(body), body.decode(), SECRET)  # text bodies too
    for bad in (signed(body, stamp=int(time.time()) - 600),  # too old
                signed(body, stamp=int(time.time()) + 600),  # from the future
                {**signed(body), "Webhook-Signature": "garbage"},
                {**signed(body), "Webhook-Timestamp": "soon"},
                signed(body, key=b"other key"),
                {k: v for k, v in signed(body).items() if k != "Webhook-Signature"}):
        with pytest.raises(WebhookVerificationError):
            verify_webhook(bad, body, SECRET)
    binary = b"\xff\x00\xfe"
    verify_webhook(signed(binary), binary, SECRET)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(signed(binary, stamp=int(time.time()) - 600), binary, SECRET)
    with pytest.raises(ValueError):
        verify_webhook(signed(body), body, "")


def test_settings_precedence(tmp_path):
    config = tmp_path / "config.ini"
    config.write_text("[default]\nurl = http://default:1\nchannel_token = d-ct\n\n"
                      "[staging]\nurl = http://staging:2\nproducer_id = s-pr\n")
    env = {"BROKER_CONFIG": str(config), "BROKER_URL": "http://env:3", "BROKER_PRODUCER_ID": "e-pr",
           "BROKER_CHANNEL_TOKEN": "e-ct"}
    s = settings_load(environ=env)
    assert (s.url, s.channel_token, s.producer_id) == ("http://env:3", "e-ct", "e-pr")  # env over [default]
    s = settings_load(environ=env, profile="staging")
    assert (s.url, s.channel_token, s.producer_id) == ("http://staging:2", "e-ct", "s-pr")  # profile over env
    s = settings_load(environ={**env, "BROKER_PROFILE": "staging"}, flags={"url": "http://flag:4", "producer_id": None})
    assert (s.url, s.producer_id) == ("http://flag:4", "s-pr")  # flags over everything; None is "not given"
    s = settings_load(environ={"BROKER_CONFIG": str(config)})
    assert (s.url, s.channel_token) == ("http://default:1", "d-ct")
    with pytest.raises(ConfigError, match="profile"):
        settings_load(environ=env, profile="nope")
    with pytest.raises(ConfigError, match="does not exist"):
        settings_load(environ={}, config=str(tmp_path / "missing.ini"))
    config.write_text("[x]\nurll = typo\n")
    with pytest.raises(ConfigError, match="unknown keys"):
        settings_load(environ={}, config=str(config), profile="x")
    with pytest.raises(ConfigError, match="BROKER_PRODUCER_TOKEN"):
        settings_load(environ={"BROKER_CONFIG": str(tmp_path / "none.ini")}).need("producer_token")
    assert settings_load(environ={"BROKER_CONFIG": str(tmp_path / "none.ini")}).url == "http://127.0.0.1:8080"
