"""How a push attempt's answer is classified, without a database or a network: the outcome of an
HTTP status or a transport error, Retry-After, the partition handler's JSON answer, and the
callback headers and Standard Webhooks signature."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from types import SimpleNamespace

import pytest
import standardwebhooks
from hypothesis import given
from hypothesis import strategies as st

from broker.xid import job_xid
from jobs.callbacks.signing import secret_bytes, sign
from jobs.callbacks.target import Target
from jobs.push.delivery import (RETRY_AFTER_CAP, HandlerAnswer, Result, handler_answer, parse_retry_after,
                                request_headers)

# --- outcome of one attempt --------------------------------------------------------------------------

@given(st.integers(min_value=200, max_value=299), st.text(max_size=20))
def test_any_2xx_is_delivered_whatever_the_error_text(code, error):
    assert Result(status_code=code, duration=0.1, error=error).outcome == "delivered"


def test_410_gone_is_its_own_outcome():
    assert Result(status_code=410, duration=0.1).outcome == "gone"


@given(st.integers(min_value=100, max_value=599).filter(lambda c: not 200 <= c < 300 and c != 410))
def test_any_other_status_is_a_failed_attempt(code):
    assert Result(status_code=code, duration=0.1).outcome == "failed"


@pytest.mark.parametrize("error, outcome", [
    ("timeout after 30s", "timeout"), ("timeout", "timeout"),
    ("connection refused", "error"), ("", "error"), ("callback address 10.0.0.1 is not allowed", "error"),
])
def test_no_status_is_a_timeout_or_an_error(error, outcome):
    assert Result(status_code=None, duration=1.0, error=error).outcome == outcome


# --- Retry-After -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [
    ("120", 120.0), (" 7 ", 7.0), ("0", 0.0), ("1.5", 1.5), ("-5", 0.0), (str(10 ** 9), RETRY_AFTER_CAP),
    (None, None), ("", None), ("soon", None), ("nan", None), ("Wed, 99 Foo 2015 07:28:00 GMT", None),
])
def test_retry_after_seconds(value, seconds):
    assert parse_retry_after(value) == seconds


def test_retry_after_http_date():
    later = datetime.now(timezone.utc) + timedelta(seconds=300)
    got = parse_retry_after(format_datetime(later, usegmt=True))
    assert 295 <= got <= 300
    assert parse_retry_after(format_datetime(datetime(2001, 1, 1, tzinfo=timezone.utc), usegmt=True)) == 0.0


@given(st.text(max_size=40))
def test_retry_after_never_raises_and_stays_in_range(value):
    got = parse_retry_after(value)
    assert got is None or 0.0 <= got <= RETRY_AFTER_CAP


# --- the partition handler's answer (jobs.partitions gates) -------------------------------------------

@pytest.mark.parametrize("body", [
    b"", b"ok", b"[1, 2]", b'"text"', b"{not json", b'{"done": true, "gate": 5}', b'{"complete": true}',
    b'{"other": 1}', b"  {}  ",
])
def test_bodies_that_mean_delivered(body):
    assert handler_answer(body, 0) is None


def test_a_gate_move_with_data():
    assert handler_answer(b'{"gate": 3, "data": {"b": 1, "a": [2]}}', 1) == HandlerAnswer(
        move=True, gate=3, payload=b'{"b":1,"a":[2]}')
    assert handler_answer(b'{"gate": 3, "done": false, "response": "t\xc3\xa9text"}', 2).payload == "tétext".encode()
    assert handler_answer(b'{"done": false, "gate": 9}', 8) == HandlerAnswer(move=True, gate=9, payload=None)


@pytest.mark.parametrize("body", [
    b'{"gate": 1}', b'{"gate": 0}', b'{"gate": "5"}', b'{"gate": true}', b'{"gate": 2.5}',
    b'{"gate": 2147483648}', b'{"done": false}', b'{"done": "no", "gate": 5}',
])
def test_bad_gate_answers_are_failed_attempts(body):
    answer = handler_answer(body, 1)
    assert answer is not None and not answer.move and answer.error.startswith("bad handler answer")
    assert not answer.no_retry


def test_handler_errors():
    assert handler_answer(b'{"error": {"message": "boom", "no_retry": true}}', 0) == HandlerAnswer(
        error="handler error: boom", no_retry=True)
    assert handler_answer(b'{"error": {"noRetry": true}}', 0).no_retry
    assert handler_answer(b'{"error": {"message": "x", "no_retry": "yes"}}', 0).no_retry is False
    assert handler_answer(b'{"error": "plain", "gate": 9}', 0) == HandlerAnswer(error="handler error: plain")
    assert len(handler_answer(json.dumps({"error": "x" * 5000}).encode(), 0).error) == 500


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                    max_leaves=12), st.integers(min_value=0, max_value=2**31 - 2))
def test_any_json_answer_is_delivered_a_forward_move_or_an_error(doc, gate):
    answer = handler_answer(json.dumps(doc).encode(), gate)
    if answer is None:
        return
    assert answer.move != bool(answer.error)
    if answer.move:
        assert gate < answer.gate <= 2**31 - 1


# --- callback headers and signature ----------------------------------------------------------------

def _target(**kw):
    values = dict(pk=1, consumer_id="c1", channel_id="ch1", url="https://example.com:8443/hook?x=1", token="tok",
                  secret=None, previous_secret=None, previous_expires=None, timeout=5.0, max_retry=None,
                  backoff=None, rate=None, updated_at=None)
    return Target(**{**values, **kw})


def _job(**kw):
    values = dict(id=42, message_id="m1", content_type="application/json", priority=3, headers={}, payload=b'{"a":1}')
    return SimpleNamespace(**{**values, **kw})


def test_target_splits_its_url():
    t = _target()
    assert (t.scheme, t.host, t.port, t.path) == ("https", "example.com", 8443, "/hook?x=1")
    assert _target(url="http://h").port == 80 and _target(url="http://h").path == "/"
    assert _target(url="https://h:99999/").port == 443, "a bad port falls back to the scheme's"


def test_a_producer_header_never_replaces_the_brokers(settings):
    settings.BROKER_CONSUMER_TOKEN_HEADER = "X-Broker-Consumer-Token"
    job = _job(headers={"X-Broker-Consumer-Token": "forged", "webhook-signature": "forged", "Host": "evil",
                        "X-Trace": "t1", "Bad Name": "v", "X-Split": "a\r\nInjected: 1"})
    headers = request_headers(job, _target())
    assert headers["X-Broker-Consumer-Token"] == "tok"
    assert "webhook-signature" not in headers and "Host" not in headers
    assert headers["X-Trace"] == "t1" and headers["X-Broker-Metadata-Headers"] == "X-Trace"
    assert "Bad Name" not in headers and "X-Split" not in headers
    assert headers["X-Broker-Message-Priority"] == "3" and headers["Content-Type"] == "application/json"


def test_signature_verifies_with_the_standardwebhooks_package():
    key = b"0123456789abcdef0123456789abcdef"
    secret = "whsec_" + base64.b64encode(key).decode()
    assert secret_bytes(secret) == key
    job = _job()
    now = int(time.time())
    headers = request_headers(job, _target(secret=secret_bytes(secret)), now=now)
    assert headers["webhook-signature"] == sign(key, headers["webhook-id"], now, job.payload)
    assert headers["webhook-id"] == job_xid(job.id) and headers["webhook-timestamp"] == str(now)
    wh = standardwebhooks.Webhook(secret)
    assert wh.verify(job.payload, {k: v for k, v in headers.items() if k.startswith("webhook-")}) == {"a": 1}


def test_secret_bytes_edge_cases():
    assert secret_bytes(None) is None and secret_bytes("") is None and secret_bytes("whsec_") is None
    assert secret_bytes(base64.b64encode(b"raw").decode()) == b"raw", "the prefix is optional"


def test_partition_headers_and_rotation(settings):
    job = _job(partition_key="k é/1", gate=4)
    t = _target(secret=b"new", previous_secret=b"old", previous_expires=4_000_000_000.0)
    headers = request_headers(job, t, now=1, worker="w1")
    assert headers["X-Broker-Partition-Key"] == "k %C3%A9/1" and headers["X-Broker-Gate"] == "4"
    assert headers["X-Broker-Lease-Owner"] == "w1"
    assert len(headers["webhook-signature"].split(" ")) == 2, "both secrets sign during a rotation"
    t.previous_expires = 1.0
    assert len(request_headers(job, t, now=1)["webhook-signature"].split(" ")) == 1
