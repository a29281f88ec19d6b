"""The API's JSON shapes and header parsing, without a database: channel and producer bodies,
Last-Modified, pagination cursors, the publish headers and batch bodies, and the HMAC gateway
signature header."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import InvalidInput, TooLarge
from web.api import pagination
from web.api.publishing import batch_parse, parse_message_id, parse_priority
from web.api.representations import changed_at, channel_repr, last_modified, message_url, producer_repr
from web.middleware import signature_make, signature_parse

WHEN = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=timezone.utc)


def test_channel_and_producer_shapes():
    channel = SimpleNamespace(channel_id="ch1", name="One", token="t", updated_at=WHEN, message_ttl=60,
                              retention=5400, event_types="closed")
    assert channel_repr(channel) == {
        "ID": "ch1", "Name": "One", "Token": "t", "ChangedAt": "2026-03-04T05:06:07Z",
        "ConsumersURL": "/channel/ch1/consumers", "MessagesURL": "/channel/ch1/messages",
        "BroadcastURL": "/channel/ch1/broadcast", "MessagesStatusURL": "/channel/ch1/messages-status", "MessageTTL": 60,
        "Retention": "90m", "EventTypes": "closed", "EventTypesURL": "/channel/ch1/event-types",
        "AsyncAPIURL": "/channel/ch1/asyncapi.json"}
    assert channel_repr(SimpleNamespace(**{**vars(channel), "retention": None}))["Retention"] is None
    producer = SimpleNamespace(producer_id="p1", name="P", token="pt", updated_at=WHEN, rate_limit_per_second=None,
                               burst=None)
    assert producer_repr(producer) == {"ID": "p1", "Name": "P", "Token": "pt", "ChangedAt": "2026-03-04T05:06:07Z",
                                       "RateLimitPerSecond": None, "Burst": None}
    assert message_url("ch1", "m1") == "/channel/ch1/message/m1"


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(timezone.utc)))
def test_changed_at_and_last_modified_name_the_same_second(value):
    assert parsedate_to_datetime(last_modified(value)) == value.replace(microsecond=0)
    assert changed_at(value) == value.replace(microsecond=0).isoformat().replace("+00:00", "Z")


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_cursors_round_trip(pk):
    cursor = pagination._encode(pk)
    assert "=" not in cursor and pagination._decode(cursor) == pk


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90LWEtbnVtYmVy", "/w"])
def test_bad_cursors_are_a_400(cursor):
    with pytest.raises(InvalidInput) as e:
        pagination._decode(cursor)
    assert e.value.code == "invalid_cursor"


def test_publish_headers():
    assert parse_priority(None) == 0 and parse_priority(" ") == 0 and parse_priority(" -3 ") == -3
    assert parse_priority(str(2**31 - 1)) == 2**31 - 1
    for bad in ("high", "1.5", str(2**31), str(-(2**31) - 1)):
        with pytest.raises(InvalidInput, match="X-Broker-Message-Priority"):
            parse_priority(bad)
    assert parse_message_id(None) is None and parse_message_id("  ") is None
    assert parse_message_id(" m-1 ") == "m-1" and parse_message_id("x" * 255) == "x" * 255
    with pytest.raises(InvalidInput) as e:
        parse_message_id("x" * 256)
    assert e.value.code == "invalid_message_id"


def test_batch_bodies(settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 100
    settings.BROKER_MAX_BATCH_MESSAGES = 3
    a, b = batch_parse(b'{"Messages": [{"Payload": "t"}, {"Payload": {"k": [1]}, "Priority": 2, "MessageID": " m ",'
                       b' "PartitionKey": "p", "Gate": 4}]}')
    assert (a.payload, a.content_type, a.priority, a.message_id, a.partition_key) == (
        b"t", "application/octet-stream", 0, None, None)
    assert (b.payload, b.content_type, b.priority, b.message_id, b.partition_key, b.gate) == (
        b'{"k":[1]}', "application/json", 2, "m", "p", 4)


@pytest.mark.parametrize("body, error, code", [
    (b"{", InvalidInput, "malformed_json"), (b"[]", InvalidInput, "invalid_batch"),
    (b'{"a": 1}', InvalidInput, "invalid_batch"), (b"[1]", InvalidInput, "invalid_batch"),
    (b'[{"Payload": ""}]', InvalidInput, "empty_body"), (b'[{"Payload": null}]', InvalidInput, "empty_body"),
    (b'[{"Payload": "' + b"x" * 101 + b'"}]', TooLarge, "payload_too_large"),
    (b'[{"Payload": "a"}, {"Payload": "b"}, {"Payload": "c"}, {"Payload": "d"}]', TooLarge, "batch_too_large"),
    (b'[{"Payload": "a", "ContentType": 5}]', InvalidInput, "invalid_batch"),
    (b'[{"Payload": "a", "Priority": true}]', InvalidInput, "invalid_priority"),
    (b'[{"Payload": "a", "MessageID": 5}]', InvalidInput, "invalid_message_id"),
    (b'[{"Payload": "a", "Gate": 1}]', InvalidInput, "invalid_gate"),
    (b'[{"Payload": "a", "PartitionKey": 5}]', InvalidInput, "invalid_partition_key"),
    (b'[{"Payload": "a", "PartitionKey": "k", "Gate": -1}]', InvalidInput, "invalid_gate"),
])
def test_bad_batch_bodies(body, error, code, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 100
    settings.BROKER_MAX_BATCH_MESSAGES = 3
    with pytest.raises(error) as e:
        batch_parse(body)
    assert e.value.code == code


def test_gateway_signature_header():
    assert signature_parse("t=17,v1=ABC,v1=def") == (17, ["abc", "def"])
    assert signature_parse(" v1=a , t=5 ") == (5, ["a"])
    for bad in ("", "t=5", "v1=a", "t=x,v1=a", "t=5,v1=", "t=5,v2=a"):
        assert signature_parse(bad) is None, bad
    secret = b"s3cret"
    assert signature_make(secret, 17, b"body") == hmac.new(secret, b"17.body", hashlib.sha256).hexdigest()


@given(st.text(max_size=60))
def test_any_signature_header_parses_or_is_none(header):
    parsed = signature_parse(header)
    assert parsed is None or (isinstance(parsed[0], int) and parsed[1] and all(s == s.lower() for s in parsed[1]))
