"""Retention in the INI seed, without a database: ``[initial-channel-retention]`` per channel and
webhook-broker's ``[prune] message-retention-days`` (read by broker.settings, checked here)."""

from __future__ import annotations

from consumers.seed import seed_parse

INI = """
[initial-channels]
ch1 = One
ch2 = Two
ch3 = Three
[initial-channel-tokens]
ch1 = t1
ch2 = t2
ch3 = t3
[initial-channel-retention]
ch1 = 15m
ch2 = forever
ch3 =
ghost = 1d
[prune]
message-retention-days = %s
"""


def test_channel_retention_and_prune_days_are_read():
    plan = seed_parse(INI % "3")
    assert plan.channels["ch1"]["retention"] == 900
    assert "retention" not in plan.channels["ch2"]  # refused: left as it is, with an error
    assert plan.channels["ch3"]["retention"] is None  # empty: the broker's default
    assert "ghost" not in plan.channels
    assert any("ch2 retention" in e for e in plan.errors) and any("ghost" in e for e in plan.errors)
    assert not any("message-retention-days" in e for e in plan.errors)


def test_a_bad_prune_key_is_reported():
    for bad in ("0", "-1", "seven", "1.5"):
        plan = seed_parse(INI % bad)
        assert any("message-retention-days" in e for e in plan.errors), bad
