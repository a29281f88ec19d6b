"""Token comparison and generation, and the API's one date-time format, without a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import Forbidden, Unauthenticated
from broker.times import rfc3339
from broker.tokens import token_generate, token_require, tokens_equal


@given(st.text(min_size=1))
def test_a_token_equals_itself(token):
    assert tokens_equal(token, token)


@given(st.text(), st.text())
def test_tokens_equal_only_when_equal_and_present(a, b):
    assert tokens_equal(a, b) == (bool(a) and a == b)


def test_missing_tokens_never_match():
    assert not tokens_equal(None, None) and not tokens_equal("", "") and not tokens_equal(None, "x")
    assert not tokens_equal("x", None)
    assert tokens_equal("\ud800", "\ud800"), "lone surrogates (from odd form input) compare, never raise"


def test_generated_tokens_are_url_safe_and_new():
    tokens = {token_generate() for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 22 and t.replace("-", "").replace("_", "").isalnum() for t in tokens)


def test_rfc3339_is_utc_with_z():
    assert rfc3339(None) is None
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)) == "2026-01-02T03:04:05Z"
    plus2 = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 1, 2, 5, 4, 5, 123, tzinfo=plus2)) == "2026-01-02T03:04:05.000123Z"


OFFSETS = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS))
def test_rfc3339_round_trips_the_instant(value):
    text = rfc3339(value)
    assert text.endswith("Z") and datetime.fromisoformat(text.replace("Z", "+00:00")) == value


def test_a_required_token_is_401_when_missing_and_403_when_wrong():
    token_require("right", "right", header="X-Token", code="token_mismatch", detail="token does not match")
    with pytest.raises(Unauthenticated) as e:
        token_require(None, "right", header="X-Token", code="token_mismatch", detail="token does not match")
    assert (e.value.code, e.value.detail) == ("unauthorized", "X-Token is required")
    for wrong in ("", "wrong", "righ", "right "):
        with pytest.raises(Forbidden) as e:
            token_require(wrong, "right", header="X-Token", code="token_mismatch", detail="token does not match")
        assert (e.value.code, e.value.detail) == ("token_mismatch", "token does not match")
    with pytest.raises(Forbidden):
        token_require("anything", None, header="X-Token", code="token_mismatch", detail="no token set: never a match")
