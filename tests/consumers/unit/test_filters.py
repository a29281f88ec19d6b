"""Content filters (issue 25), without a database: what ``filter_parse`` accepts and how it
normalizes, every rejection as 400 ``invalid_filter`` naming what is wrong, and the semantics of
``filter_matches`` (the reference the SQL function is compared with in tests/consumers/test_filters.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import InvalidInput
from consumers.filters import CONDITIONS_MAX, DEPTH_MAX, filter_matches, filter_parse, filter_text
from consumers.seed import seed_parse


def bad(raw) -> str:
    with pytest.raises(InvalidInput) as exc:
        filter_parse(raw)
    assert exc.value.code == "invalid_filter"
    return exc.value.detail


def test_accepts_text_and_objects_and_normalizes_header_names():
    text = '{"body": {"order.total": {"$gt": 100}}, "headers": {"X-Tenant": "acme"}}'
    assert filter_parse(text) == {"body": {"order.total": {"$gt": 100}}, "headers": {"x-tenant": "acme"}}
    assert filter_parse(json.loads(text)) == filter_parse(text)
    nested = {"$or": [{"body": {"a": 1}}, {"headers": {"$and": [{"X-A": {"$startsWith": "x"}}, {"x-b": {"$exists": False}}]}}]}
    assert filter_parse(nested)["$or"][1] == {"headers": {"$and": [{"x-a": {"$startsWith": "x"}}, {"x-b": {"$exists": False}}]}}
    assert json.loads(filter_text(filter_parse(text))) == filter_parse(text)


@pytest.mark.parametrize("raw", [None, "", "  ", "null", "{}", {}])
def test_empty_means_no_filter(raw):
    assert filter_parse(raw) is None and filter_text(None) == ""


@pytest.mark.parametrize(("raw", "says"), [
    ("{not json", "not valid JSON"),
    ("[1]", "non-empty object"),
    ('{"payload": {"a": 1}}', "unknown key 'payload'"),
    ('{"body": []}', "body must be a non-empty object"),
    ('{"body": {}}', "body must be a non-empty object"),
    ('{"body": {"a": {"$regex": "x"}}}', "body.a.$regex: unknown operator"),
    ('{"body": {"a": {}}}', "empty operator object"),
    ('{"body": {"a..b": 1}}', "empty path segment"),
    ('{"body": {"$where": 1}}', "not a dotted path"),
    ('{"body": {"a": {"$in": []}}}', "body.a.$in must be a list"),
    ('{"body": {"a": {"$in": 5}}}', "body.a.$in must be a list"),
    ('{"body": {"a": {"$gt": true}}}', "body.a.$gt must be a number or a string"),
    ('{"body": {"a": {"$gt": [1]}}}', "body.a.$gt must be a number or a string"),
    ('{"body": {"a": {"$exists": 1}}}', "body.a.$exists must be true or false"),
    ('{"body": {"a": {"$startsWith": 1}}}', "body.a.$startsWith must be a string"),
    ('{"body": {"a": NaN}}', "finite"),
    ('{"headers": {"x-a": 5}}', "headers.x-a must be a string"),
    ('{"headers": {"x-a": {"$gt": 5}}}', "headers.x-a.$gt must be a string"),
    ('{"headers": {"bad name": "v"}}', "not a header name"),
    ('{"$or": []}', "$or must be a non-empty list"),
    ('{"$or": [{"body": {"a": 1}}, 3]}', "$or[1] must be a non-empty object"),
    ('{"body": {"$and": {"a": 1}}}', "body.$and must be a non-empty list"),
    ('{"body": {"a": "\\u0000"}}', "NUL"),
])
def test_rejections_name_what_is_wrong(raw, says):
    assert says in bad(raw)


def test_limits():
    many = {"body": {f"k{i}": i for i in range(CONDITIONS_MAX + 1)}}
    assert f"more than {CONDITIONS_MAX} conditions" in bad(many)
    deep: dict = {"body": {"a": 1}}
    for _ in range(DEPTH_MAX + 1):
        deep = {"$and": [deep]}
    assert "nested deeper" in bad(deep)
    assert "longer than" in bad('{"body": {"a": "' + "x" * 70_000 + '"}}')


def test_semantics():
    body = {"order": {"total": 150, "id": "ord-7", "tags": ["a", "b"], "note": None}, "items": [{"sku": "x1"}]}
    headers = {"X-Tenant": "acme"}

    def match(flt, b=body, h=headers):
        return filter_matches(filter_parse(flt), **({"body": b} if b is not ... else {}), headers=h)

    assert match({"body": {"order.total": 150}})
    assert match({"body": {"order.total": 150.0}})  # numbers by value
    assert not match({"body": {"order.total": "150"}})  # no type coercion
    assert match({"body": {"order.total": {"$gt": 100, "$lte": 150}}})
    assert not match({"body": {"order.total": {"$gt": 150}}})
    assert not match({"body": {"order.id": {"$gt": 5}}})  # ordering across types never holds
    assert match({"body": {"order.id": {"$gt": "ord-6", "$startsWith": "ord-"}}})
    assert match({"body": {"items.0.sku": "x1", "order.tags": ["a", "b"]}})
    assert match({"body": {"items.-1.sku": "x1"}})
    assert match({"body": {"order.note": None, "order.missing": {"$exists": False}}})
    assert match({"body": {"order.note": {"$exists": True}}})  # JSON null is present
    assert match({"body": {"order.missing": {"$ne": 1, "$nin": [1]}}})  # $ne / $nin match an absent key
    assert not match({"body": {"order.missing": {"$in": [1]}}})
    assert match({"body": {"order.tags": {"$in": [["a", "b"], 3]}}})
    assert match({"headers": {"x-tenant": "acme"}}) and match({"headers": {"X-TENANT": {"$in": ["acme", "b"]}}})
    assert not match({"headers": {"x-tenant": "ACME"}})  # values are case-sensitive
    assert match({"$or": [{"body": {"order.total": 1}}, {"headers": {"x-tenant": "acme"}}]})
    assert not match({"body": {"order.total": 150}, "headers": {"x-tenant": "other"}})  # all must hold
    # a payload that is not JSON: no body condition holds, not even a negative one
    assert not match({"body": {"order.missing": {"$exists": False}}}, b=...)
    assert match({"$or": [{"body": {"a": 1}}, {"headers": {"x-tenant": "acme"}}]}, b=...)
    assert filter_matches(None, headers={})


def test_seed_key():
    text = """[initial-channels]
ch=C
[initial-channel-tokens]
ch=t
[initial-consumers]
c1=
c2=
[c1]
channel=ch
type=pull
token=t
filter={"body": {"kind": "order"}}
[c2]
channel=ch
type=pull
token=t
filter={"body": {"kind": {"$regex": 1}}}
"""
    plan = seed_parse(text)
    assert plan.consumers["c1"]["filter"] == {"body": {"kind": "order"}}
    assert "c2" not in plan.consumers
    assert any(e.startswith("consumer c2: filter: body.kind.$regex: unknown operator") for e in plan.errors)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.sampled_from(["a", "b", "ab"]))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), scalars, max_size=3), scalars)
def test_negations_are_complements_on_json_bodies(body, value):
    """$ne is not $eq and $nin is not $in, for any JSON body (present or absent key): both pairs
    on every example."""
    eq = filter_matches({"body": {"a": {"$eq": value}}}, body=body, headers={})
    ne = filter_matches({"body": {"a": {"$ne": value}}}, body=body, headers={})
    assert eq != ne
    isin = filter_matches({"body": {"a": {"$in": [value, 3]}}}, body=body, headers={})
    nin = filter_matches({"body": {"a": {"$nin": [value, 3]}}}, body=body, headers={})
    assert isin != nin
