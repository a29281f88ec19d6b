"""Publishing's pure rules, without a database: partition key and gate headers, and the time of a
scheduled message."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import InvalidInput
from jobs.publish.messages import GATE_MAX, PARTITION_KEY_MAX, partition_headers, partition_parse
from jobs.publish.scheduled import scheduled_for_parse


def test_partition_key_and_gate():
    assert partition_parse(None, None) == (None, 0)
    assert partition_parse("k", None) == ("k", 0) and partition_parse("k", " ") == ("k", 0)
    assert partition_parse("k", " 12 ") == ("k", 12) and partition_parse("k", str(GATE_MAX)) == ("k", GATE_MAX)
    assert partition_parse("k" * PARTITION_KEY_MAX, "0") == ("k" * PARTITION_KEY_MAX, 0)


@pytest.mark.parametrize("key, gate, code", [
    ("", None, "invalid_partition_key"), ("  ", "1", "invalid_partition_key"),
    ("k" * (PARTITION_KEY_MAX + 1), None, "invalid_partition_key"),
    ("k", "-1", "invalid_gate"), ("k", "1.5", "invalid_gate"), ("k", "٣", "invalid_gate"),
    ("k", str(GATE_MAX + 1), "invalid_gate"), (None, "1", "invalid_gate"),
])
def test_bad_partition_headers(key, gate, code):
    with pytest.raises(InvalidInput) as e:
        partition_parse(key, gate)
    assert e.value.code == code


def test_a_utf8_key_sent_through_wsgi_is_decoded():
    assert partition_headers({"X-Broker-Partition-Key": "é".encode().decode("latin-1"), "X-Broker-Gate": "2"}) == ("é", 2)
    assert partition_headers({"X-Broker-Partition-Key": "\xff"}) == ("\xff", 0), "not UTF-8: kept as sent"
    assert partition_headers({}) == (None, 0)


@given(st.text(max_size=300), st.text(max_size=12) | st.none())
def test_partition_parse_answers_or_is_a_400(key, gate):
    try:
        parsed_key, parsed_gate = partition_parse(key, gate)
    except InvalidInput as exc:
        assert exc.code in ("invalid_partition_key", "invalid_gate")
    else:
        assert parsed_key == key and 0 <= parsed_gate <= GATE_MAX


@pytest.mark.parametrize("raw, when", [
    ("2030-01-02T03:04:05Z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
    ("2030-01-02t03:04:05z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
    ("2030-01-02 05:04:05.5+02:00", datetime(2030, 1, 2, 3, 4, 5, 500000, tzinfo=timezone.utc)),
])
def test_scheduled_for_in_utc(raw, when):
    got = scheduled_for_parse(raw)
    assert got == when and got.utcoffset() == timedelta(0)


@pytest.mark.parametrize("raw", ["", "2030-01-02", "2030-01-02T03:04:05", "tomorrow", "2030-13-02T03:04:05Z",
                                 "9999-12-31T23:59:59-23:00", None])
def test_bad_scheduled_for(raw):
    with pytest.raises(InvalidInput) as e:
        scheduled_for_parse(raw)
    assert e.value.code == "invalid_scheduled_for"
