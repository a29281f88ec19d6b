"""Hostile inputs over HTTP on every body-taking endpoint: oversized, truncated JSON, non-UTF-8 and
deeply nested bodies, malformed cookies. Always a 4xx with the JSON error body, never a 5xx."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from broker.xid import job_xid
from jobs.models import Job
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.django_db

PUBLISH = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_PRODUCER_ID": "p1",
           "HTTP_X_BROKER_PRODUCER_TOKEN": "p-token"}
PULL = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"}
ADMIN = {"HTTP_X_BROKER_ADMIN_TOKEN": ADMIN_TOKEN}
C2 = "/channel/ch1/consumer/c2"
JSON_ENDPOINTS = [  # (method, path, headers)
    ("POST", "/channel/ch1/messages", PUBLISH),
    ("POST", f"{C2}/pull", PULL),
    ("POST", f"{C2}/ack", PULL),
    ("POST", f"{C2}/job/1", PULL),
    ("POST", f"{C2}/job/1/progress", PULL),
    ("POST", f"{C2}/unpin", PULL),
    ("PUT", "/channel/ch9", ADMIN),
    ("PUT", "/producer/p9", ADMIN),
    ("PUT", "/channel/ch1/consumer/c9", ADMIN),
]
DEEP = b"[" * 50000 + b"]" * 50000
DEEP_OBJECT = b'{"a":' * 50000 + b"1" + b"}" * 50000
BAD_BODIES = {
    "truncated": b'{"batch": 1, "Jobs": [{"ID": "1", "NextSt',
    "non_utf8": b'{"batch": "\xff\xfe\xfa"}',
    "deep_list": DEEP,
    "deep_object": DEEP_OBJECT,
    "nul": b'{"a": "\x00"}',
    "not_json": b"\x00\x01\x02",
}


def assert_4xx(r, what):
    assert 400 <= r.status_code < 500, (what, r.status_code, r.content[:300])
    body = r.json()
    assert set(body) >= {"error", "detail"}, (what, body)


@pytest.mark.parametrize("method,path,headers", JSON_ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in JSON_ENDPOINTS])
def test_malformed_json_bodies_are_4xx(world, method, path, headers):
    client = APIClient()
    for name, body in BAD_BODIES.items():
        r = client.generic(method, path, body, content_type="application/json", **headers)
        if name == "nul" and r.status_code < 300:
            continue  # a NUL inside a JSON string is valid JSON; it just must not break anything
        assert_4xx(r, name)


def test_oversized_bodies_are_413(world, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 1024
    client = APIClient()
    r = client.generic("POST", "/channel/ch1/broadcast", b"x" * 1025, content_type="text/plain", **PUBLISH)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    assert client.generic("POST", "/channel/ch1/broadcast", b"x" * 1024, content_type="text/plain",
                          **PUBLISH).status_code == 201
    r = client.generic("POST", "/channel/ch1/messages", b'[{"Payload": "' + b"y" * 2000 + b'"}]',
                       content_type="application/json", **PUBLISH)
    assert r.status_code == 413
    # a lying Content-Length larger than the limit is refused before the body is read
    r = client.generic("POST", "/channel/ch1/broadcast", b"x", content_type="text/plain", CONTENT_LENGTH="99999999",
                       **PUBLISH)
    assert r.status_code == 413
    r = client.generic("POST", "/channel/ch1/broadcast", b"x", content_type="text/plain", CONTENT_LENGTH="abc",
                       **PUBLISH)
    assert_4xx(r, "bad content-length")


def test_oversized_json_control_bodies_are_413(world):
    """The pull endpoints' JSON bodies are small by nature; a huge one is refused, not parsed."""
    client = APIClient()
    huge = b'{"Jobs": [' + b",".join([b'{"ID": "1", "NextState": "DELIVERED"}'] * 60000) + b"]}"
    assert len(huge) > 2 * 1024 * 1024
    assert world.publish().status_code == 201
    job = Job.objects.get(consumer__consumer_id="c2")
    for path in (f"{C2}/ack", f"{C2}/pull", f"{C2}/job/{job_xid(job.pk)}", f"{C2}/job/{job_xid(job.pk)}/progress"):
        r = client.generic("POST", path, huge, content_type="application/json", **PULL)
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large", (path, r.status_code)


def test_malformed_session_cookie_is_ignored(world):
    client = APIClient()
    for value in ("abcdefghij\x00klmnop", "x" * 5000, "' OR 1=1 --"):
        client.cookies["sessionid"] = value
        assert client.get("/channel/ch1/messages", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token").status_code == 200
        assert client.get("/producers").status_code == 401


def test_non_utf8_and_odd_headers_are_4xx(world):
    client = APIClient()
    r = client.generic("POST", "/channel/ch1/broadcast", b"x", content_type="text/plain",
                       HTTP_X_BROKER_MESSAGE_PRIORITY="\xff\xfe", **PUBLISH)
    assert_4xx(r, "priority")
    r = client.generic("POST", "/channel/ch1/broadcast", b"x", content_type="text/plain",
                       HTTP_X_BROKER_SCHEDULED_FOR="2030-01-01T00:00:00+23:59", **PUBLISH)
    assert r.status_code in (201, 400)
    r = client.generic("POST", "/channel/ch1/broadcast", b"x", content_type="text/plain",
                       HTTP_X_BROKER_SCHEDULED_FOR="0001-01-01T00:00:00+23:59", **PUBLISH)
    assert_4xx(r, "scheduled-for out of range")
    r = client.generic("PUT", "/channel/ch1/consumer/c9", b"callbackUrl=http://[::1&token=t",
                       content_type="application/x-www-form-urlencoded", **ADMIN)
    assert_4xx(r, "bad IPv6 literal")
    r = client.generic("PUT", "/channel/ch1/consumer/c9", b"callbackUrl=http://h:99999/x&token=t",
                       content_type="application/x-www-form-urlencoded", **ADMIN)
    assert_4xx(r, "bad port")
