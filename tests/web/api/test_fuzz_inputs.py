"""Property-based fuzzing of the seed parser and of publish input parsing: never an exception,
never a 5xx, bad input always a 4xx with a JSON error body."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from broker.errors import DomainError
from consumers.seed import seed_parse
from web.api.errors import status_for
from web.api.publishing import parse_message_id, parse_priority
from web.middleware import signature_parse

ini_line = st.one_of(
    st.sampled_from(["[initial-channels]", "[initial-consumers]", "[initial-channel-tokens]", "[c]",
                     "[initial-producers]", "[initial-producer-tokens]", "channel=a", "type=pull", "type=",
                     "token=t", "a=A", "c=http://h/x", "c=", "[", "=", "%(x)s", "\x00"]),
    st.text(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ini_line, max_size=30).map("\n".join))
def test_seed_parser_never_raises(text):
    plan = seed_parse(text)
    for consumer in plan.consumers.values():
        assert consumer["type"] in ("push", "pull")
        assert consumer["channel"] in plan.channels
        assert consumer["token"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_header_parsers_raise_only_api_errors(raw):
    for parse in (parse_priority, parse_message_id):
        try:
            parse(raw)
        except DomainError as exc:
            assert status_for(exc) == 400
    signature_parse(raw)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300), priority=st.text(max_size=12), mid=st.text(max_size=20),
       ctype=st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded",
                              "multipart/form-data", "application/octet-stream"]))
def test_publish_never_500(world, body, priority, mid, ctype):
    headers = {"HTTP_X_BROKER_MESSAGE_PRIORITY": priority}
    if mid.isprintable():
        headers["HTTP_X_BROKER_MESSAGE_ID"] = mid
    r = APIClient().generic("POST", "/channel/ch1/broadcast", body, content_type=ctype,
                            HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                            HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)
    assert r.status_code < 500
    if r.status_code >= 400:
        assert "error" in r.json()


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20).map(lambda v: __import__("json").dumps(v).encode())))
def test_batch_publish_never_500(world, body):
    r = APIClient().generic("POST", "/channel/ch1/messages", body, content_type="application/json",
                            HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                            HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
    assert r.status_code < 500
    if r.status_code >= 400:
        assert "error" in r.json()


@pytest.mark.django_db
def test_deeply_nested_and_non_utf8_inputs_are_4xx(world, api):
    deep = b"[" * 100000 + b"]" * 100000
    r = APIClient().generic("POST", "/channel/ch1/messages", deep, content_type="application/json",
                            HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                            HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
    assert 400 <= r.status_code < 500
    r = api.generic("PUT", "/channel/x", b"\xff\xfe\xfa", content_type="application/json")
    assert 400 <= r.status_code < 500
    r = api.generic("PUT", "/channel/x", b"token=\xff\xfe", content_type="application/x-www-form-urlencoded")
    assert r.status_code < 500
