"""Filters (issue 17 part 2) over HTTP: message types on broadcast and batch, consumer messageTypes
with several patterns each, jobs only for matching consumers (in the publish statement), the type
on push callbacks (a real receiver) and on pulled jobs, the seed key and the 400s."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from broker.message_types import message_type_matches
from consumers.seed import seed_parse
from jobs.models import Job, JobStatus
from tests.helpers import seed_one_channel
from tests.jobs.conftest import json_of
from tests.jobs.pull.conftest import PullClient

pytestmark = pytest.mark.django_db(transaction=True)

PATTERNS = {
    "all": "",  # no patterns: every message
    "star": "*",
    "orders": "order.*, invoice.paid",
    "exact": "order.created",
    "multi": "a_b.*,x:y/z,billing.refund.*",
}
TYPES = [None, "order", "order.created", "order.created.v2", "orderly", "order_created", "invoice.paid",
         "invoice.paid.late", "a_b", "a_b.c", "aXb.c", "x:y/z", "billing.refund.partial", "billing"]


def _consumers(make):
    make.channel()
    make.producer()
    for cid, patterns in PATTERNS.items():
        make.consumer(cid, type="pull", callback=None, token=f"{cid}-token", messageTypes=patterns)


def _batch(client, items, **headers):
    return client.generic("POST", "/channel/ch1/messages", json.dumps(items), content_type="application/json",
                          HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                          HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)


def _expected(prefix: str) -> dict[str, set[str]]:
    patterns = {cid: [p.strip() for p in raw.split(",") if p.strip()] for cid, raw in PATTERNS.items()}
    return {cid: {f"{prefix}{i}" for i, t in enumerate(TYPES) if message_type_matches(t, pats)}
            for cid, pats in patterns.items()}


def _jobs_by_consumer(prefix: str) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {cid: set() for cid in PATTERNS}
    for cid, mid in Job.objects.filter(message__message_id__startswith=prefix).values_list(
            "consumer__consumer_id", "message__message_id"):
        got[cid].add(mid)
    return got


def test_consumer_put_get_message_types_and_400s(make, api):
    make.channel()
    body = make.consumer("k", type="pull", callback=None, messageTypes=" order.* ,invoice.paid,order.*")
    assert body["MessageTypes"] == "order.*,invoice.paid"  # as the PUT takes it: comma-separated, trimmed
    got = api.get("/channel/ch1/consumer/k")
    assert got.json()["MessageTypes"] == "order.*,invoice.paid"
    since = got["Last-Modified"]
    # an update without messageTypes keeps them
    r = api.put("/channel/ch1/consumer/k", {"name": "K"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200 and r.json()["MessageTypes"] == "order.*,invoice.paid"
    for bad in ("order.**", "order*", "*.created", "has space", "x" * 129, "a.*.b"):
        r = api.put("/channel/ch1/consumer/k", {"messageTypes": bad}, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
        assert r.status_code == 400, (bad, r.content)
        assert r.json()["error"] == "invalid_message_types" and r.json()["detail"]
        r = api.get("/channel/ch1/consumer/k")
    # empty: every message again
    r = api.put("/channel/ch1/consumer/k", {"messageTypes": ""}, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r.status_code == 200 and r.json()["MessageTypes"] == ""


def test_publish_type_400s_write_nothing(make, client_anon):
    _consumers(make)
    for bad in ("has space", "x" * 129, "star*", "a,b"):
        r = make.publish(HTTP_X_BROKER_MESSAGE_TYPE=bad)
        assert r.status_code == 400, bad
        assert json_of(r)["error"] == "invalid_message_type"
    for bad in ("has space", 7, ["a"], "x" * 129):
        r = _batch(client_anon, [{"Payload": "ok", "Type": "fine"}, {"Payload": "x", "Type": bad}])
        assert r.status_code == 400, bad
        assert json_of(r)["error"] == "invalid_message_type" and "message 1" in json_of(r)["detail"]
    assert Job.objects.count() == 0


def test_broadcast_creates_jobs_only_for_matching_consumers(make, api):
    _consumers(make)
    for i, t in enumerate(TYPES):
        headers = {"HTTP_X_BROKER_MESSAGE_ID": f"b{i}"}
        if t is not None:
            headers["HTTP_X_BROKER_MESSAGE_TYPE"] = t
        assert make.publish(**headers).status_code == 201
    expected = _expected("b")
    assert _jobs_by_consumer("b") == expected
    # spot checks of the rules, independent of the reference function
    assert "b0" in expected["all"] and "b0" in expected["star"] and "b0" not in expected["orders"]
    assert {"b1", "b2", "b3", "b6"} <= expected["orders"] and not {"b4", "b5", "b7"} & expected["orders"]
    assert expected["exact"] == {"b2"}
    assert expected["multi"] == {"b8", "b9", "b11", "b12"}
    assert api.get("/channel/ch1/message/b2").json()["Type"] == "order.created"
    assert api.get("/channel/ch1/message/b0").json()["Type"] is None
    status = api.get("/channel/ch1/messages-status").json()["consumers"]
    assert status["exact"]["QUEUED"] == 1 and status["all"]["QUEUED"] == len(TYPES)


def test_batch_types_per_item_and_header_default(make, client_anon):
    _consumers(make)
    items = [{"MessageID": f"t{i}", "Payload": {"i": i}, **({"Type": t} if t is not None else {})}
             for i, t in enumerate(TYPES)]
    r = _batch(client_anon, items)
    assert r.status_code == 201 and json_of(r)["Created"] == len(TYPES)
    assert _jobs_by_consumer("t") == _expected("t")
    # X-Broker-Message-Type applies to the items without a Type of their own
    r = _batch(client_anon, [{"MessageID": "h0", "Payload": "a"}, {"MessageID": "h1", "Payload": "b", "Type": "zzz"}],
               HTTP_X_BROKER_MESSAGE_TYPE="order.created")
    assert r.status_code == 201
    got = _jobs_by_consumer("h")
    assert got["exact"] == {"h0"} and got["orders"] == {"h0"} and got["all"] == {"h0", "h1"}


def test_push_callback_carries_the_type_and_filtered_messages_are_not_sent(make, receiver, dispatcher):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), messageTypes="order.*,invoice.paid")
    dispatcher()
    for i, t in enumerate(["order.created", "user.signup", "invoice.paid", None, "order"]):
        headers = {"HTTP_X_BROKER_MESSAGE_ID": f"m{i}"}
        if t:
            headers["HTTP_X_BROKER_MESSAGE_TYPE"] = t
        assert make.publish(body=json.dumps({"i": i}).encode(), **headers).status_code == 201
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 3, what="3 deliveries")
    got = {r.headers["x-broker-message-id"]: r.headers.get("x-broker-message-type") for r in receiver.at("/cb")}
    assert got == {"m0": "order.created", "m2": "invoice.paid", "m4": "order"}
    assert Job.objects.count() == 3


def test_pulled_and_listed_jobs_carry_type(make):
    make.channel()
    make.producer()
    make.consumer("c2", type="pull", callback=None, token="c2-token", messageTypes="order.*,*")
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="typed", HTTP_X_BROKER_MESSAGE_TYPE="order.paid").status_code == 201
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="plain").status_code == 201
    pc = PullClient(APIClient())
    listed = {j["Message"]["MessageID"]: j.get("Type") for j in pc.queued().json()["Result"]}
    assert listed == {"typed": "order.paid", "plain": None}
    r = pc.pull(batch=10)
    assert r.status_code == 200, r.content
    pulled = {j["Message"]["MessageID"]: j for j in r.json()["Result"]}
    assert pulled["typed"]["Type"] == "order.paid"
    assert "Type" not in pulled["plain"]  # an untyped message: no Type, as PartitionKey


def test_seed_message_types_key():
    plan = seed_parse(seed_one_channel("""
[initial-consumers]
good=
bad=
[good]
token=t
channel=ch
type=pull
messageTypes=order.*, invoice.paid
[bad]
token=t
channel=ch
type=pull
messageTypes=order**
"""))
    assert plan.consumers["good"]["message_types"] == ["order.*", "invoice.paid"]
    assert "bad" not in plan.consumers
    assert any("bad" in e and "messageTypes" in e for e in plan.errors)
