"""The pull protocol's pure rules, without a database: query and body parsing (limit, timeouts,
pull and ack bodies, gates, olderThan), the order of the auth checks on a looked-up row, the
priority-group checks of a pull and the JSON shapes of jobs and messages."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import Forbidden, InvalidInput, NotFound, PreconditionFailed, TooLarge, Unauthenticated
from broker.tracing import TraceContext
from broker.xid import job_xid
from jobs.pull.ack import ACK_MAX, ack_request_parse, gate_parse
from jobs.pull.auth import PullContext, auth_check
from jobs.pull.claim import PULL_BATCH_MAX, PullRequest, _waited_out, pull_request_check, pull_request_parse
from jobs.pull.fields import QUEUED_JOBS_DEFAULT, QUEUED_JOBS_MAX, TIMEOUT_MAX, limit_parse, timeout_parse
from jobs.pull.purge import older_than_parse
from jobs.pull.shapes import claimed_repr, message_repr, seconds_repr
from jobs.state.transitions import DEAD, DELIVERED, QUEUED


def _code(exc_info) -> str:
    return exc_info.value.code


# --- limit, timeouts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, limit", [(None, QUEUED_JOBS_DEFAULT), ("", QUEUED_JOBS_DEFAULT), ("0", 0),
                                        ("7", 7), ("+7", 7), ("100", 100), ("101", QUEUED_JOBS_MAX),
                                        ("99999999999999999999", QUEUED_JOBS_MAX), ("0000000000007", 7),
                                        ("9" * 5000, QUEUED_JOBS_MAX)])
def test_limit(raw, limit):
    assert limit_parse(raw) == limit


@given(st.text(max_size=8).filter(lambda t: t not in ("",) and not (t.lstrip("+").isascii()
                                                                    and t.lstrip("+").isdigit()
                                                                    and t.count("+") <= 1 and not t.startswith("++")
                                                                    and (t.startswith("+") or "+" not in t))))
def test_anything_but_a_non_negative_integer_is_a_bad_limit(raw):
    with pytest.raises(InvalidInput) as e:
        limit_parse(raw)
    assert _code(e) == "invalid_limit"


def test_timeouts():
    assert timeout_parse(None) is None and timeout_parse(0) is None, "zero means not given (Go's uint)"
    assert timeout_parse(5) == 5.0 and timeout_parse(0.5) == 0.5 and timeout_parse(TIMEOUT_MAX) == TIMEOUT_MAX
    for bad in (True, "5", -1, TIMEOUT_MAX + 1, math.inf, math.nan, [1]):
        with pytest.raises(InvalidInput) as e:
            timeout_parse(bad, "Delay")
        assert _code(e) == "invalid_Delay"


# --- the pull body ----------------------------------------------------------------------------------

def test_pull_defaults_and_case_insensitive_keys():
    assert pull_request_parse({}) == PullRequest()
    req = pull_request_parse({"Batch": 10, "EXPIRES": 2, "No_Wait": True, "max_bytes": 100,
                              "IncrementalTimeout": 3, "group": "g1", "priority": 9, "id": "pin",
                              "min_pending": 0, "min_ack_pending": 4})
    assert req == PullRequest(batch=10, expires=2.0, no_wait=True, max_bytes=100, incremental_timeout=3.0,
                              group="g1", priority=9, pin_id="pin", min_pending=0, min_ack_pending=4)


@pytest.mark.parametrize("body, code", [
    ([], "malformed_request"), ("x", "malformed_request"),
    ({"batch": 0}, "invalid_batch"), ({"batch": PULL_BATCH_MAX + 1}, "invalid_batch"), ({"batch": True}, "invalid_batch"),
    ({"batch": 1.5}, "invalid_batch"), ({"expires": -1}, "invalid_expires"), ({"expires": 61}, "invalid_expires"),
    ({"expires": math.nan}, "invalid_expires"), ({"no_wait": 1}, "invalid_no_wait"),
    ({"max_bytes": 0}, "invalid_max_bytes"), ({"incrementaltimeout": -1}, "invalid_IncrementalTimeout"),
    ({"min_pending": -1}, "invalid_min_pending"), ({"min_ack_pending": "1"}, "invalid_min_ack_pending"),
    ({"priority": 10}, "invalid_priority"), ({"group": 5}, "invalid_group"), ({"id": "x" * 65}, "invalid_id"),
])
def test_bad_pull_bodies(body, code):
    with pytest.raises(InvalidInput) as e:
        pull_request_parse(body)
    assert _code(e) == code


@given(st.dictionaries(st.sampled_from(["batch", "expires", "no_wait", "max_bytes", "IncrementalTimeout",
                                        "group", "priority", "id", "min_pending", "x"]),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70)))
def test_any_pull_body_parses_or_is_a_400(body):
    try:
        req = pull_request_parse(body)
    except InvalidInput as exc:
        assert exc.code.startswith("invalid_")
    else:
        assert 1 <= req.batch <= PULL_BATCH_MAX and 0 <= req.expires <= 60 and 0 <= req.priority <= 9


def _ctx(policy="none", groups=None):
    return PullContext(channel_pk=1, channel_id="ch", consumer_pk=2, consumer_id="c", consumer_type="pull",
                       max_retry=5, policy=policy, groups=groups)


@pytest.mark.parametrize("policy, req, code", [
    ("none", PullRequest(min_pending=1), "not_overflow_consumer"),
    ("pinned_client", PullRequest(min_ack_pending=1, group="g"), "not_overflow_consumer"),
    ("overflow", PullRequest(pin_id="p", group="g"), "not_pinned_consumer"),
    ("overflow", PullRequest(), "group_missing"),
    ("pinned_client", PullRequest(group="other"), "invalid_group"),
    ("none", PullRequest(group="g"), "invalid_group"),
])
def test_priority_group_checks_of_a_pull_in_order(policy, req, code):
    with pytest.raises(InvalidInput) as e:
        pull_request_check(ctx=_ctx(policy, None if policy == "none" else ["g"]), req=req)
    assert _code(e) == code


def test_priority_group_pulls_that_pass():
    pull_request_check(ctx=_ctx(), req=PullRequest())
    pull_request_check(ctx=_ctx("overflow", ["g"]), req=PullRequest(group="g", min_pending=3))
    pull_request_check(ctx=_ctx("pinned_client", ["g"]), req=PullRequest(group="g", pin_id="p"))


# --- the ack body -------------------------------------------------------------------------------------

def test_ack_items():
    a, b, c = job_xid(1), job_xid(2), job_xid(3)
    items = ack_request_parse({"Jobs": [{"ID": a, "NextState": "DELIVERED"},
                                        {"id": b, "nextstate": "QUEUED", "delay": 4},
                                        {"ID": c, "NextState": "QUEUED", "Gate": 2, "Payload": {"k": 1}},
                                        {"ID": "junk", "NextState": "DEAD"}]})
    assert [(i.job_id, i.target, i.delay, i.gate, i.payload) for i in items] == [
        (1, DELIVERED, None, None, None), (2, QUEUED, 4.0, None, None), (3, QUEUED, None, 2, b'{"k":1}'),
        (None, DEAD, None, None, None)]
    assert items[3].raw_id == "junk", "an id naming no job is answered per job, not refused"


@pytest.mark.parametrize("body, code", [
    ([], "malformed_request"), ({}, "invalid_jobs"), ({"Jobs": []}, "invalid_jobs"), ({"Jobs": [1]}, "invalid_jobs"),
    ({"Jobs": [{"ID": True, "NextState": "DEAD"}]}, "invalid_jobs"),
    ({"Jobs": [{"ID": "a", "NextState": "DEAD"}, {"ID": "a", "NextState": "DEAD"}]}, "duplicate_job"),
    ({"Jobs": [{"ID": "a", "NextState": "INFLIGHT"}]}, "invalid_next_state"),
    ({"Jobs": [{"ID": "a", "NextState": 2}]}, "invalid_next_state"),
    ({"Jobs": [{"ID": "a", "NextState": "DEAD", "Delay": 1}]}, "invalid_delay"),
    ({"Jobs": [{"ID": "a", "NextState": "DELIVERED", "Gate": 1}]}, "invalid_gate"),
    ({"Jobs": [{"ID": "a", "NextState": "QUEUED", "Delay": 1, "Gate": 1}]}, "invalid_gate"),
    ({"Jobs": [{"ID": "a", "NextState": "QUEUED", "Payload": "p"}]}, "invalid_payload"),
])
def test_bad_ack_bodies(body, code):
    with pytest.raises(InvalidInput) as e:
        ack_request_parse(body)
    assert _code(e) == code


def test_an_ack_of_too_many_jobs_is_too_large():
    with pytest.raises(TooLarge):
        ack_request_parse({"Jobs": [{"ID": str(i), "NextState": "DEAD"} for i in range(ACK_MAX + 1)]})


def test_a_job_named_twice_in_two_spellings_is_a_duplicate():
    with pytest.raises(InvalidInput, match="twice"):
        ack_request_parse({"Jobs": [{"ID": job_xid(5), "NextState": "DEAD"}, {"id": job_xid(5), "nextstate": "DEAD"}]})


def test_gates():
    assert gate_parse(0, None) == (0, None)
    assert gate_parse(3, "text") == (3, b"text")
    assert gate_parse(3, [1, {"a": None}]) == (3, b'[1,{"a":null}]')
    assert gate_parse(2.0, None) == (2, None)  # a whole float is that integer (JSON Schema 2020-12, broker.numbers)
    for bad in (-1, 2**31, True, "1", 1.5):
        with pytest.raises(InvalidInput, match="Gate must be"):
            gate_parse(bad, None)


# --- olderThan ------------------------------------------------------------------------------------------

def test_older_than():
    assert older_than_parse(None) == {} and older_than_parse("  ") == {}
    assert older_than_parse("3600") == {"older_than_seconds": 3600.0}
    assert older_than_parse("2026-01-02T03:04:05Z") == {"older_than": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}
    for bad in ("-1", "nan", "1e10", "yesterday", "2026-01-02T03:04:05"):
        with pytest.raises(InvalidInput) as e:
            older_than_parse(bad)
        assert _code(e) == "invalid_olderThan"


# --- auth: the spec's order on one looked-up row ------------------------------------------------------------

ROW = (10, "s3cret-ch", 20, "s3cret-c", "pull", None, 30, QUEUED, 0, 0.0, False, "none", None, None)


def _auth(row=ROW, channel_token="s3cret-ch", consumer_token="s3cret-c", **kw):
    return auth_check(row, channel_id="ch", consumer_id="c", channel_token=channel_token,
                      consumer_token=consumer_token, **kw)


@pytest.mark.parametrize("row, kw, error, code", [
    (None, {}, NotFound, "channel_not_found"),
    (ROW, {"channel_token": None}, Unauthenticated, "unauthorized"),
    (ROW, {"channel_token": "wrong"}, Forbidden, "channel_token_mismatch"),
    (ROW[:2] + (None,) * 12, {}, NotFound, "consumer_not_found"),
    (ROW[:2] + (None,) * 12, {"channel_token": "wrong"}, Forbidden, "channel_token_mismatch"),
    (ROW, {"consumer_token": None}, Unauthenticated, "unauthorized"),
    (ROW, {"consumer_token": "wrong"}, Forbidden, "consumer_token_mismatch"),
    (ROW[:4] + ("push",) + ROW[5:], {}, PreconditionFailed, "consumer_not_pull"),
    (ROW[:4] + ("push",) + ROW[5:], {"consumer_token": "wrong"}, Forbidden, "consumer_token_mismatch"),
    (ROW[:6] + (None,) + ROW[7:], {"with_job": True}, NotFound, "job_not_found"),
])
def test_auth_checks_in_the_specs_order(row, kw, error, code, settings):
    with pytest.raises(error) as e:
        _auth(row, **kw)
    assert _code(e) == code
    assert "s3cret" not in e.value.detail and "wrong" not in e.value.detail, "an answer never echoes a token"


def test_auth_context(settings):
    settings.BROKER_MAX_RETRY = 5
    ctx = _auth(with_job=True)
    assert (ctx.channel_pk, ctx.consumer_pk, ctx.max_retry, ctx.job, ctx.policy) == (10, 20, 5, (30, QUEUED, 0, 0.0, False), "none")
    admin = _auth(channel_token=None, consumer_token=None, admin=True, require_pull=False,
                  row=ROW[:4] + ("push", 2) + ROW[6:11] + ("pinned_client", json.dumps(["g"]), 60.0))
    assert (admin.consumer_type, admin.max_retry, admin.policy, admin.groups, admin.priority_timeout) == (
        "push", 2, "pinned_client", ["g"], 60.0)


# --- representations ----------------------------------------------------------------------------------

def test_seconds_and_messages():
    assert seconds_repr(5.0) == 5 and isinstance(seconds_repr(5.0), int) and seconds_repr(0.5) == 0.5
    assert message_repr("m", b'{"a":1}', "application/json", '{"H": "v"}') == {
        "MessageID": "m", "Payload": '{"a":1}', "ContentType": "application/json", "Headers": {"H": "v"}}
    binary = message_repr("m", b"\xff\x00", "application/octet-stream", None)
    assert binary["Payload"] == "/wA=" and binary["PayloadEncoding"] == "base64" and binary["Headers"] == {}


def test_claimed_job_shape():
    job = SimpleNamespace(id=7, priority=2, incremental_timeout=3.0, retry_count=1,
                          deadline=datetime(2026, 1, 1, tzinfo=timezone.utc), message_id="m", payload=b"p",
                          content_type="text/plain", headers={}, partition_key="k", gate=4,
                          message_type="order.paid", receipt=None, trace=None)
    assert claimed_repr(job) == {
        "ID": job_xid(7), "Priority": 2, "IncrementalTimeout": 3, "Attempt": 2, "Deadline": "2026-01-01T00:00:00Z",
        "Message": {"MessageID": "m", "Payload": "p", "ContentType": "text/plain", "Headers": {}},
        "PartitionKey": "k", "Gate": 4, "Type": "order.paid"}
    job.trace = TraceContext(f"00-{'a' * 32}-{'b' * 16}-01", "k=v")  # issue 25: trace context in Headers
    assert claimed_repr(job)["Message"]["Headers"] == {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01",
                                                       "tracestate": "k=v"}


@pytest.mark.parametrize("woken, listening, sleep, remaining, due_in, deadline_in, ends", [
    (False, True, 0.97, 0.97, None, None, True),  # slept out the whole wait: nothing new to claim
    (True, True, 0.97, 0.97, None, None, False),  # woken by a NOTIFY: claim
    (False, False, 0.97, 0.97, None, None, False),  # the listener was down: a NOTIFY may be lost
    (False, True, 5.0, 12.0, None, None, False),  # the safety net's pause, time left: look again
    (False, True, 0.5, 0.5, 0.45, None, False),  # a delayed job falls due before the end: claim it
    (False, True, 0.5, 0.5, None, 0.3, False),  # a deadline passes before the end: sweep and claim
    (False, True, 0.5, 0.5, 3.0, 9.0, True),  # both after the end: the next pull sees them
])
def test_a_long_poll_that_slept_out_its_time_unwoken_ends_without_another_claim(
        woken, listening, sleep, remaining, due_in, deadline_in, ends):
    assert _waited_out(woken=woken, listening=listening, sleep=sleep, remaining=remaining,
                       due_in=due_in, deadline_in=deadline_in) is ends
