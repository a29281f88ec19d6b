"""Content filters (issue 25) over HTTP: the consumer field (form JSON text, JSON body object, GET
``Filter``, 400 ``invalid_filter``), jobs only for consumers whose filter matches (broadcast, batch,
partitioned publish; combined with messageTypes; header names case-insensitive; non-JSON payloads
never match a body condition and never fail a publish), a push consumer with a real receiver, replay,
and the SQL function against the Python reference on generated filters and bodies."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from consumers.filters import filter_matches, filter_parse
from consumers.models import Consumer
from consumers.seed import seed_apply, seed_parse
from jobs.models import Job, JobStatus

FILTERS = {
    "big": {"body": {"order.total": {"$gt": 100}}},
    "acme": {"headers": {"X-Tenant": "acme"}},
    "eu_or_vip": {"$or": [{"body": {"order.region": {"$in": ["eu", "uk"]}}}, {"body": {"customer.vip": True}}]},
    "sku": {"body": {"items.0.sku": {"$startsWith": "A-"}, "order.coupon": {"$exists": False}}},
    "not_test": {"body": {"order.env": {"$ne": "test"}}},
    "none": None,
}
MESSAGES = [  # (id, payload, content type, headers)
    ("m0", {"order": {"total": 150, "region": "eu"}, "items": [{"sku": "A-1"}]}, "application/json", {"X-Tenant": "acme"}),
    ("m1", {"order": {"total": 50, "env": "test", "coupon": "x"}, "customer": {"vip": True}}, "application/json", {}),
    ("m2", {"order": {"total": "150"}}, "application/json; charset=utf-8", {"x-tenant": "ACME"}),
    ("m3", b'{"order": {"total": 500}', "application/json", {"X-TENANT": "acme"}),  # invalid JSON
    ("m4", b'{"order": {"total": 500}}', "text/plain", {}),  # JSON text, but not a JSON content type
    ("m5", b"\xff\xfe binary", "application/json", {}),  # not UTF-8
    ("m6", {"order": {"total": 101.5, "region": "us"}, "items": [{"sku": "B-9"}]}, "application/vnd.api+json", {}),
]


def _payload(raw) -> bytes:
    return raw if isinstance(raw, bytes) else json.dumps(raw).encode()


def _expected(name: str) -> set[str]:
    flt = FILTERS[name]
    got = set()
    for mid, raw, ctype, headers in MESSAGES:
        body = raw if not isinstance(raw, bytes) and "json" in ctype else ...
        kwargs = {} if body is ... else {"body": body}
        if filter_matches(filter_parse(flt) if flt else None, headers=headers, **kwargs):
            got.add(mid)
    return got


def _jobs() -> dict[str, set[str]]:
    got: dict[str, set[str]] = {name: set() for name in FILTERS}
    for cid, mid in Job.objects.values_list("consumer__consumer_id", "message__message_id"):
        got[cid].add(mid)
    return got


def _consumers(make):
    make.channel()
    make.producer()
    for name, flt in FILTERS.items():
        extra = {"filter": json.dumps(flt)} if flt else {}
        make.consumer(name, type="pull", callback=None, token=f"{name}-token", **extra)


def _publish(make, mid, raw, ctype, headers):
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if headers:
        extra["HTTP_X_BROKER_METADATA_HEADERS"] = ",".join(headers)
    return make.publish(body=_payload(raw), content_type=ctype, HTTP_X_BROKER_MESSAGE_ID=mid, **extra)


pytestmark = pytest.mark.django_db


def test_consumer_put_get_filter_and_400s(make, api):
    make.channel()
    body = make.consumer("k", type="pull", callback=None, filter='{"headers": {"X-Tenant": "acme"}}')
    assert body["Filter"] == {"headers": {"x-tenant": "acme"}}
    assert api.get("/channel/ch1/consumer/k").json()["Filter"] == {"headers": {"x-tenant": "acme"}}
    since = api.get("/channel/ch1/consumer/k")["Last-Modified"]
    r = api.put("/channel/ch1/consumer/k", {"filter": {"body": {"a.b": {"$in": [1, 2]}}}}, format="json",
                HTTP_IF_UNMODIFIED_SINCE=since)  # a JSON body may give the object itself
    assert r.status_code == 200 and r.json()["Filter"] == {"body": {"a.b": {"$in": [1, 2]}}}
    assert Consumer.objects.get(consumer_id="k").filter_plan == [["b", "{a,b}", "$in", [1, 2]]]
    for bad, says in (('{"body": {"a": {"$regex": "x"}}}', "body.a.$regex: unknown operator"),
                      ("{oops", "not valid JSON"), ('{"headers": {"x-a": 1}}', "headers.x-a must be a string")):
        r = api.put("/channel/ch1/consumer/k2", {"token": "t", "type": "pull", "filter": bad})
        assert r.status_code == 400 and r.json()["error"] == "invalid_filter" and says in r.json()["detail"], r.json()
    assert not Consumer.objects.filter(consumer_id="k2").exists()
    since = api.get("/channel/ch1/consumer/k")["Last-Modified"]
    r = api.put("/channel/ch1/consumer/k", {"filter": ""}, HTTP_IF_UNMODIFIED_SINCE=since)  # empty: no filter
    assert r.json()["Filter"] is None and Consumer.objects.get(consumer_id="k").filter_plan is None


def test_broadcast_creates_jobs_only_for_matching_consumers(make):
    _consumers(make)
    for mid, raw, ctype, headers in MESSAGES:
        assert _publish(make, mid, raw, ctype, headers).status_code == 201, mid  # never a failed publish
    expected = {name: _expected(name) for name in FILTERS}
    assert _jobs() == expected
    assert expected["big"] == {"m0", "m6"} and expected["acme"] == {"m0", "m3"}  # sanity of the reference (values: case-sensitive)
    assert expected["none"] == {m[0] for m in MESSAGES} and expected["not_test"] == {"m0", "m2", "m6"}


def test_batch_and_partitioned_publish_filter_per_message(make, client_anon):
    _consumers(make)
    items = [{"MessageID": mid, "Payload": raw if not isinstance(raw, bytes) else raw.decode("latin-1"),
              "ContentType": ctype} for mid, raw, ctype, _ in MESSAGES if not headers_of(mid)]
    items.append({"MessageID": "m6", "Payload": {"order": {"total": 1}}})  # a repeated id: the first one counts
    r = client_anon.generic("POST", "/channel/ch1/messages", json.dumps(items), content_type="application/json",
                            HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                            HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
    assert r.status_code == 201, r.content
    got = _jobs()
    assert got["big"] == {"m6"} and got["eu_or_vip"] == {"m1"} and got["acme"] == set()
    r = make.publish(body=b'{"order": {"total": 999}}', HTTP_X_BROKER_MESSAGE_ID="p0", HTTP_X_BROKER_PARTITION_KEY="k")
    assert r.status_code == 201
    assert set(Job.objects.filter(message__message_id="p0").values_list("consumer__consumer_id", flat=True)) == {
        "big", "not_test", "none"}


def headers_of(mid: str) -> dict:
    return next(h for m, _, _, h in MESSAGES if m == mid)


def test_filter_and_message_types_must_both_match(make):
    make.channel()
    make.producer()
    make.consumer("both", type="pull", callback=None, messageTypes="order.*", filter='{"body": {"total": {"$gte": 10}}}')
    for mid, mtype, total in (("a", "order.created", 10), ("b", "user.signup", 10), ("c", "order.paid", 9)):
        make.publish(body=json.dumps({"total": total}).encode(), HTTP_X_BROKER_MESSAGE_ID=mid,
                     HTTP_X_BROKER_MESSAGE_TYPE=mtype)
    assert list(Job.objects.values_list("message__message_id", flat=True)) == ["a"]


def test_replay_honours_the_filter(make, api):
    make.channel()
    make.producer()
    for i in range(6):
        make.publish(body=json.dumps({"n": i}).encode(), HTTP_X_BROKER_MESSAGE_ID=f"r{i}")
    make.consumer("late", type="pull", callback=None, token="late-token", filter='{"body": {"n": {"$in": [1, 3, 5]}}}')
    since = (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()
    r = api.post("/channel/ch1/consumer/late/replay", {"since": since}, format="json")
    assert r.status_code == 202, r.content
    assert set(Job.objects.filter(consumer__consumer_id="late").values_list("message__message_id", flat=True)) == {
        "r1", "r3", "r5"}


@pytest.mark.django_db(transaction=True)
def test_push_consumer_gets_only_matching_messages(make, receiver, dispatcher):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), filter='{"body": {"kind": "order"}, "headers": {"x-env": {"$ne": "test"}}}')
    dispatcher()
    sent = [("o1", {"kind": "order"}, {}), ("o2", {"kind": "user"}, {}), ("o3", {"kind": "order"}, {"X-Env": "test"}),
            ("o4", {"kind": "order"}, {"X-Env": "prod"})]
    for mid, body, headers in sent:
        assert _publish(make, mid, body, "application/json", headers).status_code == 201
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 2, what="2 deliveries")
    assert sorted(r.headers["x-broker-message-id"] for r in receiver.at("/cb")) == ["o1", "o4"]
    assert Job.objects.count() == 2


# --- the SQL function against the Python reference ----------------------------------------------

_keys = st.sampled_from(["a", "b", "a.b", "a.0", "c"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.5, "x", "xy", "y", ""]))
_ops = st.one_of(
    _scalars,
    st.fixed_dictionaries({"$eq": _scalars}), st.fixed_dictionaries({"$ne": _scalars}),
    st.fixed_dictionaries({"$in": st.lists(_scalars, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"$nin": st.lists(_scalars, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"$gt": st.one_of(st.integers(-3, 3), st.sampled_from(["x", "a"]))}),
    st.fixed_dictionaries({"$lte": st.one_of(st.integers(-3, 3), st.sampled_from(["x", "a"]))}),
    st.fixed_dictionaries({"$exists": st.booleans()}), st.fixed_dictionaries({"$startsWith": st.sampled_from(["x", ""])}),
)
_conds = st.dictionaries(_keys, _ops, min_size=1, max_size=3)
_filters = st.one_of(
    st.fixed_dictionaries({"body": _conds}),
    st.fixed_dictionaries({"body": _conds, "headers": st.fixed_dictionaries({"X-A": st.sampled_from(["x", "y"])})}),
    st.fixed_dictionaries({"$or": st.lists(st.fixed_dictionaries({"body": _conds}), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"body": st.fixed_dictionaries({"$or": st.lists(_conds, min_size=1, max_size=2)})}),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                         st.dictionaries(_keys, inner, max_size=2)), max_leaves=6)
_bodies = st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c"]), _values, max_size=3), _scalars)


@settings(max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(flt=_filters, body=_bodies, json_payload=st.booleans(), header=st.sampled_from(["x", "y", None]))
def test_sql_function_agrees_with_the_python_reference(flt, body, json_payload, header):
    parsed = filter_parse(flt)
    headers = {} if header is None else {"x-a": header}
    payload = json.dumps(body).encode() if json_payload else b"\x00not json"
    with connection.cursor() as cur:
        cur.execute("SELECT broker_filter_match(broker_filter_compile(%s::jsonb), broker_payload_json(%s, %s),"
                    " broker_headers_lower(%s::jsonb))",
                    [json.dumps(parsed), payload, "application/json", json.dumps(headers)])
        got = cur.fetchone()[0]
    expected = filter_matches(parsed, headers=headers, **({"body": body} if json_payload else {}))
    assert got is expected, (parsed, body, json_payload, headers)


# --- $and, nested $or, the seed key ---------------------------------------------------------------

def test_and_or_at_any_level_over_http(make):
    make.channel()
    make.producer()
    make.consumer("k", type="pull", callback=None, filter=json.dumps({"$and": [
        {"body": {"$or": [{"n": {"$gte": 5}}, {"tag": "vip"}]}},
        {"headers": {"X-Region": {"$in": ["eu", "uk"]}}},
    ]}))
    sent = [("a", {"n": 7}, {"X-Region": "eu"}), ("b", {"n": 1, "tag": "vip"}, {"X-Region": "uk"}),
            ("c", {"n": 7}, {"X-Region": "us"}), ("d", {"n": 1}, {"X-Region": "eu"}), ("e", {"n": 9}, {})]
    for mid, body, headers in sent:
        assert _publish(make, mid, body, "application/json", headers).status_code == 201
    assert set(Job.objects.values_list("message__message_id", flat=True)) == {"a", "b"}


def test_seed_key_filter(make, api):
    ini = ("[initial-channels]\nch9=Nine\n[initial-channel-tokens]\nch9=t9\n[initial-consumers]\nf1=\nf2=\nbad=\n"
           "[f1]\ntoken=f1\nchannel=ch9\ntype=pull\nfilter={\"body\": {\"kind\": {\"$in\": [\"a\", \"b\"]}}}\n"
           "[f2]\ntoken=f2\nchannel=ch9\ntype=pull\nfilter=\n"
           "[bad]\ntoken=b\nchannel=ch9\ntype=pull\nfilter={\"body\": {\"kind\": {\"$like\": 1}}}\n")
    plan = seed_parse(ini)
    assert any("bad" in e and "$like" in e for e in plan.errors), plan.errors
    seed_apply(plan)
    assert api.get("/channel/ch9/consumer/f1").json()["Filter"] == {"body": {"kind": {"$in": ["a", "b"]}}}
    assert api.get("/channel/ch9/consumer/f2").json()["Filter"] is None
    assert not Consumer.objects.filter(consumer_id="bad").exists()
