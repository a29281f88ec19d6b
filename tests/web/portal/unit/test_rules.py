"""The portal's pure rules: a link's ttl and scope as the API reads them, tokens and what is stored
of them, a link's or session's state, the rate limit's windows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from broker.errors import InvalidInput
from web.portal.rules import (TTL_DEFAULT, TTL_MAX, access_state, link_label, portal_scope_parse, portal_ttl_parse,
                              rate_minute, rate_retry_after, token_hash, token_new)


@pytest.mark.parametrize(("raw", "seconds"), [
    (None, 3600), ("", 3600), ("  ", 3600), ("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800),
    ("2w", 1209600), ("30d", TTL_MAX), ("720h", TTL_MAX), ("3600", 3600), (1, 1), (TTL_MAX, TTL_MAX), ("1S", 1),
])
def test_ttl_takes_the_brokers_durations_up_to_thirty_days(raw, seconds):
    assert portal_ttl_parse(raw) == seconds
    assert TTL_DEFAULT == 3600


@pytest.mark.parametrize("raw", ["31d", "721h", "5w", str(TTL_MAX + 1), TTL_MAX + 1, "0", 0, "0s", "-1", "1y", "abc",
                                 "1.5h", True, "1 d 2h"])
def test_ttl_outside_one_second_to_thirty_days_or_not_a_duration_is_refused(raw):
    with pytest.raises(InvalidInput) as refused:
        portal_ttl_parse(raw)
    assert refused.value.code == "invalid_ttl"


@pytest.mark.parametrize(("raw", "scope"), [(None, "manage"), ("", "manage"), ("manage", "manage"), ("read", "read"),
                                            (" READ ", "read")])
def test_scope_is_manage_unless_read(raw, scope):
    assert portal_scope_parse(raw) == scope


@pytest.mark.parametrize("raw", ["write", "admin", "readonly", "1"])
def test_another_scope_is_refused(raw):
    with pytest.raises(InvalidInput) as refused:
        portal_scope_parse(raw)
    assert refused.value.code == "invalid_scope"


def test_tokens_are_random_url_safe_and_stored_only_as_their_hash():
    tokens = {token_new() for _ in range(50)}
    assert len(tokens) == 50
    token = tokens.pop()
    assert len(token) >= 43 and all(c.isalnum() or c in "-_" for c in token)
    stored = token_hash(token)
    assert stored == token_hash(token) and len(stored) == 64 and token not in stored
    assert token_hash(token + "x") != stored
    assert len(token_hash("\udcff\x00")) == 64  # a malformed cookie value hashes like any other


def test_a_link_or_session_is_active_until_it_expires_and_revocation_wins():
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    later = now + timedelta(hours=1)
    assert access_state(expires_at=later, revoked_at=None, now=now) == "active"
    assert access_state(expires_at=now, revoked_at=None, now=now) == "expired"
    assert access_state(expires_at=now - timedelta(seconds=1), revoked_at=None, now=now) == "expired"
    assert access_state(expires_at=later, revoked_at=now, now=now) == "revoked"
    assert access_state(expires_at=now - timedelta(days=1), revoked_at=now, now=now) == "revoked"


def test_rate_windows_are_whole_minutes():
    assert rate_minute(120.0) == rate_minute(179.9) == 2 and rate_minute(180.0) == 3
    assert rate_retry_after(120.0) == 60 and rate_retry_after(179.5) == 1 and rate_retry_after(150.2) == 30


def test_advisories_name_a_link_by_its_id():
    assert link_label(7) == "portal link 7"


def test_time_ago_reads_as_people_say_it():
    from web.portal.rules import time_ago

    assert [time_ago(s) for s in (0, 0.4, 1, 59, 60, 12 * 60 + 30, 3 * 3600 + 5, 86400, 2 * 86400 + 7)] == [
        "just now", "just now", "1 s ago", "59 s ago", "1 min ago", "12 min ago", "3 h ago", "1 day ago", "2 days ago"]
    assert time_ago(-300) == "in 5 min" and time_ago(-3 * 86400) == "in 3 days"


def test_idle_sessions_and_how_often_a_session_is_marked_seen():
    from datetime import datetime, timedelta, timezone

    from web.portal.rules import seen_every, session_idle

    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    idle = timedelta(minutes=30)
    assert not session_idle(last_seen_at=now - timedelta(minutes=30), now=now, idle=idle)
    assert session_idle(last_seen_at=now - timedelta(minutes=30, seconds=1), now=now, idle=idle)
    assert seen_every(idle) == timedelta(minutes=1) and seen_every(timedelta(seconds=40)) == timedelta(seconds=20)
