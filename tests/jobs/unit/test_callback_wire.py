"""DB-free: the bytes of a callback request as the push client writes them (jobs.callbacks.http): the
header section built in one go gives the same bytes as one header at a time (CR and LF in a value
become spaces, a value outside latin-1 goes as UTF-8), the request line and Host header per URL; and
X-Request-ID is a version 4 UUID."""

from __future__ import annotations

import uuid

import pytest

from jobs.callbacks.http import _header_bytes, _header_section, _request_start
from jobs.push.delivery import request_id

pytestmark = pytest.mark.unit


def _one_at_a_time(headers: dict) -> bytes:
    return b"".join(name.encode("latin-1") + b": " + _header_bytes(value) + b"\r\n" for name, value in headers.items())


@pytest.mark.parametrize("headers", [
    {"Content-Type": "application/json", "X-Broker-Message-ID": "m1", "X-Seq": "12"},
    {"X-Split": "a\r\nInjected: 1", "X-Ok": "b"},  # a line break in a value never splits the header
    {"X-Latin": "caf\xe9", "X-Utf8": "caf\xe9 \u2713"},  # latin-1 as is, beyond it UTF-8
    {"X-Lf": "a\nb"},
    {},
])
def test_the_header_section_is_the_same_built_in_one_go(headers):
    assert _header_section(headers) == _one_at_a_time(headers)


def test_a_header_name_outside_latin_1_is_refused_as_before():
    with pytest.raises(UnicodeEncodeError):
        _header_section({"X-\u2713": "v"})


def test_request_start_per_url():
    assert _request_start("http", "127.0.0.1", 8080, "/a b?x=é") == (
        b"POST /a%20b?x=%C3%A9 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert _request_start("https", "::1", 443, "/") == b"POST / HTTP/1.1\r\nHost: [::1]\r\n"
    assert _request_start("http", "example.com", 80, "/") == b"POST / HTTP/1.1\r\nHost: example.com\r\n"


def test_request_ids_are_version_4_uuids_in_hex():
    seen = set()
    for _ in range(500):
        text = request_id()
        value = uuid.UUID(hex=text)
        assert (value.version, value.variant, value.hex) == (4, uuid.RFC_4122, text)
        seen.add(text)
    assert len(seen) == 500
