"""What the registry PUTs reject (issue 25 part 4): every field the OpenAPI schema bounds is bounded
in the code too, so out-of-range input is a 400 naming the field, never a failed INSERT (500)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

LONG = "x" * 256
CASES = [  # (path, JSON body, error code)
    ("/channel/" + "c" * 256, {"token": "t"}, "invalid_id"),
    ("/channel/c%00k", {"token": "t"}, "invalid_id"),
    ("/channel/ok", {"token": LONG}, "invalid_token"),
    ("/channel/ok", {"name": LONG}, "invalid_name"),
    ("/channel/ok", {"name": "a\x00b"}, "invalid_name"),
    ("/channel/ok", {"messageTTL": 0}, "invalid_ttl"),
    ("/producer/" + "p" * 256, {"token": "t"}, "invalid_id"),
    ("/producer/p", {"token": "a\x00"}, "invalid_token"),
    ("/producer/p", {"rateLimitPerSecond": -1}, "invalid_rateLimitPerSecond"),
    ("/channel/ch1/consumer/" + "k" * 256, {"type": "pull"}, "invalid_id"),
    ("/channel/ch1/consumer/k", {"type": "pull", "token": LONG}, "invalid_token"),
    ("/channel/ch1/consumer/k", {"type": "pull", "name": "\x00"}, "invalid_name"),
    ("/channel/ch1/consumer/k", {"callbackUrl": "http://example.com/" + "a" * 2048}, "invalid_callback_url"),
    ("/channel/ch1/consumer/k", {"type": "pull", "retryBackoff": "nan,inf"}, "invalid_retryBackoff"),
    ("/channel/ch1/consumer/k", {"type": "pull", "retryBackoff": ",".join(["1.5"] * 80)}, "invalid_retryBackoff"),
    ("/channel/ch1/consumer/k", {"type": "pull", "circuitBreakerOpenAfterSeconds": "inf"},
     "invalid_circuitBreakerOpenAfterSeconds"),
    ("/channel/ch1/consumer/k", {"type": "pull", "filter": '{"body": []}'}, "invalid_filter"),
]


@pytest.mark.parametrize("path, body, code", CASES)
def test_out_of_range_is_a_400_naming_the_field(make, api, path, body, code):
    make.channel()
    api.raise_request_exception = False
    r = api.put(path, body, format="json")
    assert r.status_code == 400 and r.json()["error"] == code, (r.status_code, r.content[:200])


LOOKUPS = [  # (method, path, JSON body): ids the database cannot hold, at lookups; values it refuses
    ("get", "/channel/c%00k", None),
    ("put", "/channel/ch1/consumer/k%00", {"type": "pull"}),
    ("put", "/channel/c%00h/consumer/k", {"type": "pull"}),
    ("get", "/channel/ch1/consumer/c%00k", None),
    ("delete", "/channel/ch1/consumer/c%00k", None),
    ("post", "/channel/ch1/consumer/k%00/pull", {"batch": 1}),
    ("post", "/channel/c%00h/broadcast", {"a": 1}),
    ("get", "/channel/c%00h/messages", None),
    ("get", "/channel/ch1/message/m%00", None),
    ("put", "/channel/ch1/consumer/k", {"type": "pull", "filter": {"headers": {"x": "\ud800"}}}),
    ("put", "/channel/ch1/consumer/k", {"type": "pull", "name": "\ud800"}),
    ("put", "/channel/ok", {"token": "\udfff"}),
]


@pytest.mark.parametrize("method, path, body", LOOKUPS)
def test_a_value_the_database_cannot_hold_is_a_4xx_never_a_500(make, api, method, path, body):
    make.channel()
    api.raise_request_exception = False
    data = json.dumps(body).encode() if body is not None else b""  # ASCII: a lone surrogate as \\ud800
    r = api.generic(method.upper(), path, data, content_type="application/json")
    assert 400 <= r.status_code < 500 and "error" in r.json(), (r.status_code, r.content[:200])
