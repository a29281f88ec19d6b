"""The single publish through the fast lane (web.api.fast_lane.FastLaneMiddleware) answers exactly as
the full stack does (BroadcastView): each request below is sent twice on the same database state (a
savepoint rolled back in between), and the answers (status, body, every header but the generated
message id in Location) must be equal."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from tests.web.api.test_fast_lane import both

pytestmark = pytest.mark.django_db

PUBLISH = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_PRODUCER_ID": "p1",
           "HTTP_X_BROKER_PRODUCER_TOKEN": "p-token"}


def same(fast, full, *, lane=True):
    """Equal answers, the generated message id (an xid, new for each request) masked."""
    def masked(r):
        headers = [(k, re.sub(r"/message/[0-9a-v]{20}$", "/message/<xid>", v)) for k, v in r.headers.items()]
        return r.status_code, r.content, sorted(headers)

    assert getattr(fast.wsgi_request, "broker_fast_lane", False) is lane
    assert not getattr(full.wsgi_request, "broker_fast_lane", False)
    assert masked(fast) == masked(full)
    return fast


LATER = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
CASES = [
    (b'{"a": 1}', PUBLISH, 201),
    (b'{"a": 1}', {**PUBLISH, "HTTP_X_BROKER_MESSAGE_ID": "fixed-id", "HTTP_X_BROKER_MESSAGE_PRIORITY": "3",
                   "HTTP_X_BROKER_METADATA_HEADERS": "X-Trace,Missing", "HTTP_X_TRACE": "t1",
                   "HTTP_X_BROKER_MESSAGE_TYPE": "order.created", "HTTP_X_BROKER_MESSAGE_TTL": "60",
                   "HTTP_TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, 201),
    (b'{"a": 1}', {**PUBLISH, "HTTP_X_BROKER_PARTITION_KEY": "k1", "HTTP_X_BROKER_GATE": "0"}, 201),
    (b'{"a": 1}', {**PUBLISH, "HTTP_X_BROKER_SCHEDULED_FOR": LATER, "HTTP_X_BROKER_MESSAGE_ID": "later"}, 201),
    (b"", PUBLISH, 400),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_MESSAGE_PRIORITY": "high"}, 400),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_GATE": "1"}, 400),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_MESSAGE_TTL": "-5"}, 400),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_SCHEDULED_FOR": "tomorrow"}, 400),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_CHANNEL_TOKEN": "wrong"}, 403),
    (b"x", {**PUBLISH, "HTTP_X_BROKER_PRODUCER_TOKEN": "wrong"}, 403),
    (b"x", {"HTTP_X_BROKER_PRODUCER_ID": "p1"}, 403),  # no channel token: a mismatch, as webhook-broker answers
    (b"x", {**PUBLISH, "HTTP_X_BROKER_MESSAGE_ID": "taken"}, 409),
]


@pytest.mark.parametrize("body,headers,code", CASES)
def test_publish_same_answers(world, settings, body, headers, code):
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="taken").status_code == 201
    r = same(*both(settings, "POST", "/channel/ch1/broadcast", body, **headers))
    assert r.status_code == code, r.content


def test_unknown_channel_and_too_large_same_answers(world, settings):
    assert same(*both(settings, "POST", "/channel/nope/broadcast", b"x", **PUBLISH)).status_code == 404
    settings.BROKER_MAX_PAYLOAD_BYTES = 4
    assert same(*both(settings, "POST", "/channel/ch1/broadcast", b"12345", **PUBLISH)).status_code == 413


def test_other_methods_take_the_full_stack(world, settings):
    assert same(*both(settings, "GET", "/channel/ch1/broadcast", **PUBLISH), lane=False).status_code == 405
