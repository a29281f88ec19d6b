"""Trace context (W3C, issue 25 part 2) over HTTP: a producer's traceparent / tracestate is stored
with the message (broadcast header, batch item or the batch's header), a message without one (or
with an invalid one) gets a new trace, every push attempt to a real receiver carries the message's
trace id with a span id of its own, and pulled and listed jobs carry it in Message.Headers."""

from __future__ import annotations

import json
import re

import pytest

from broker.models import Message
from jobs.models import Job, JobStatus
from tests.jobs.conftest import Reply
from tests.jobs.pull.conftest import PullClient

pytestmark = pytest.mark.django_db

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def _stored(mid: str) -> tuple[str, str]:
    m = Message.objects.get(message_id=mid)
    return m.traceparent, m.tracestate


def test_broadcast_stores_the_producers_trace_context_or_starts_a_new_one(world, api):
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="given", HTTP_TRACEPARENT=PARENT, HTTP_TRACESTATE=STATE).status_code == 201
    assert _stored("given") == (PARENT, STATE)
    body = api.get("/channel/ch1/message/given").json()
    assert (body["TraceParent"], body["TraceState"]) == (PARENT, STATE)
    fresh = set()
    for mid, extra in (("none", {}), ("bad", {"HTTP_TRACEPARENT": "00-xyz-01"}),
                       ("zero", {"HTTP_TRACEPARENT": f"00-{'0' * 32}-00f067aa0ba902b7-01", "HTTP_TRACESTATE": STATE})):
        assert world.publish(HTTP_X_BROKER_MESSAGE_ID=mid, **extra).status_code == 201  # never a failed publish
        traceparent, tracestate = _stored(mid)
        match = TRACEPARENT.fullmatch(traceparent)
        assert match and match.group(1) != TRACE and match.group(1) != "0" * 32, traceparent
        assert tracestate == ""  # a tracestate without a valid traceparent is dropped
        fresh.add(match.group(1))
    assert len(fresh) == 3  # a new trace each


def test_batch_items_carry_their_own_or_the_requests_trace_context(world, client_anon):
    own = f"00-{'a' * 32}-{'b' * 16}-00"
    items = [{"MessageID": "b0", "Payload": "x", "traceparent": own, "tracestate": "k=v"},
             {"MessageID": "b1", "Payload": "y"},
             {"MessageID": "b2", "Payload": "z", "traceparent": "garbage"}]
    r = client_anon.generic("POST", "/channel/ch1/messages", json.dumps(items), content_type="application/json",
                            HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                            HTTP_X_BROKER_PRODUCER_TOKEN="p-token", HTTP_TRACEPARENT=PARENT, HTTP_TRACESTATE=STATE)
    assert r.status_code == 201, r.content
    assert _stored("b0") == (own, "k=v")
    assert _stored("b1") == (PARENT, STATE)  # the request's header for an item without its own
    assert _stored("b2") == (PARENT, STATE)  # an invalid item value: the request's (else a new trace)


@pytest.mark.django_db(transaction=True)
def test_every_push_attempt_has_the_messages_trace_id_and_its_own_span_id(make, receiver, dispatcher):
    make.basics().consumer("c1", callback=receiver.url("/cb"), retryBackoff="0.1", maxRetry="5")
    attempts: dict[str, int] = {}

    def first_two_fail(n, req):  # per message: two failed attempts, then a success
        mid = req.headers["x-broker-message-id"]
        attempts[mid] = attempts.get(mid, 0) + 1
        return Reply(500 if attempts[mid] <= 2 else 204)

    receiver.behave("/cb", first_two_fail)
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="t1", HTTP_TRACEPARENT=PARENT, HTTP_TRACESTATE=STATE).status_code == 201
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="t2").status_code == 201  # no trace context: a new trace
    dispatcher()
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 2, what="2 deliveries")
    calls = receiver.at("/cb")
    t1 = [r for r in calls if r.headers["x-broker-message-id"] == "t1"]
    assert len(t1) == 3, len(t1)  # two failed attempts and the successful one
    spans = set()
    for request in t1:
        trace_id, span_id, flags = TRACEPARENT.fullmatch(request.headers["traceparent"]).groups()
        assert (trace_id, flags) == (TRACE, "01") and span_id != "00f067aa0ba902b7"
        assert request.headers["tracestate"] == STATE
        spans.add(span_id)
    assert len(spans) == len(t1)  # a span id of its own per attempt
    stored, _ = _stored("t2")
    for request in (r for r in calls if r.headers["x-broker-message-id"] == "t2"):
        assert TRACEPARENT.fullmatch(request.headers["traceparent"]).group(1) == stored[3:35]
        assert "tracestate" not in request.headers


def test_pulled_and_listed_jobs_carry_the_trace_context(world, client_anon):
    pc = PullClient(client_anon)
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="p1", HTTP_TRACEPARENT=PARENT, HTTP_TRACESTATE=STATE).status_code == 201
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="p2").status_code == 201
    stored, _ = _stored("p2")
    listed = {j["Message"]["MessageID"]: j for j in pc.queued().json()["Result"]}
    assert listed["p1"]["Message"]["Headers"] == {"traceparent": PARENT, "tracestate": STATE}
    assert listed["p2"]["Message"]["Headers"] == {"traceparent": stored}
    r = pc.pull(batch=10)
    assert r.status_code == 200, r.content
    pulled = {j["Message"]["MessageID"]: j for j in r.json()["Result"]}
    assert pulled["p1"]["Message"]["Headers"] == {"traceparent": PARENT, "tracestate": STATE}
    assert pulled["p2"]["Message"]["Headers"] == {"traceparent": stored}
