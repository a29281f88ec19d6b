"""Job IDs and generated message IDs are xids (github.com/rs/xid): the codec, without a database
(the IDs the API shows mapping back to their jobs: tests/broker/test_xid.py)."""

from __future__ import annotations

import base64
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import xid
from broker.xid import job_pk, job_xid, xid_bytes, xid_new

XID_RE = re.compile(r"[0-9a-v]{20}")
PKS = st.integers(min_value=1, max_value=2**63 - 1)


def rs_xid_string(raw: bytes) -> str:
    """How rs/xid writes 12 bytes: base32hex without padding, lower case (the stdlib reference)."""
    return base64.b32hexencode(raw)[:20].decode("ascii").lower()


# --- the codec (no database) --------------------------------------------------------------------------

@given(PKS)
def test_job_ids_round_trip(pk):
    text = job_xid(pk)
    assert len(text) == 20 and XID_RE.fullmatch(text)
    raw = xid_bytes(text)
    assert raw is not None and len(raw) == 12
    assert raw[4:] == pk.to_bytes(8, "big"), "the last 8 bytes are the key, big-endian"
    assert rs_xid_string(raw) == text, "the same text rs/xid writes for these 12 bytes"
    assert job_pk(text) == pk


@given(st.binary(min_size=12, max_size=12))
def test_any_12_bytes_encode_as_rs_xid_does(raw):
    text = rs_xid_string(raw)
    assert xid._encode_int(int.from_bytes(raw, "big")) == text
    assert xid_bytes(text) == raw


@given(PKS, st.integers(min_value=0, max_value=19), st.sampled_from(xid.ALPHABET))
def test_a_changed_character_names_no_job(pk, position, char):
    text = job_xid(pk)
    changed = text[:position] + char + text[position + 1:]
    if changed != text:
        assert job_pk(changed) is None, "the check bytes catch every single-character change"


@given(st.text(max_size=30))
def test_only_canonical_job_ids_decode(text):
    pk = job_pk(text)
    if pk is not None:
        assert job_xid(pk) == text, "decoding accepts exactly the strings the encoder writes"


@pytest.mark.parametrize("text", [
    "", "1", "123456789", "00000000000000000001", "not-a-job-id", " " * 20,
    "ÿ" * 20, "０" * 20, "é" + "0" * 19, "w" * 20, "=" * 20, None, 12345, b"0" * 20,
])
def test_junk_is_no_job(text):
    assert job_pk(text) is None


def test_exact_form_only():
    pk = 123456789
    text = job_xid(pk)
    assert job_pk(text.upper()) is None, "upper case is not how rs/xid writes"
    assert job_pk(text + "0") is None and job_pk(text[:-1]) is None
    # the last character carries 1 bit and 4 unused ones: rs/xid rejects a non-canonical one
    last = xid.ALPHABET.index(text[-1])
    assert last & 0xF == 0
    for low in range(1, 16):
        assert job_pk(text[:-1] + xid.ALPHABET[last | low]) is None
    # other check bytes: the key alone does not make a job ID
    other = xid._encode_int((xid._check(pk) ^ 0x1) << 64 | pk)
    assert xid_bytes(other) is not None and job_pk(other) is None
    assert job_pk(job_xid(0)) is None, "0 is no job"


def test_message_ids_are_xids():
    a, b = xid_new(), xid_new()
    assert XID_RE.fullmatch(a) and XID_RE.fullmatch(b) and a != b
    raw_a, raw_b = xid_bytes(a), xid_bytes(b)
    assert raw_a[4:9] == raw_b[4:9], "same machine and process"
    assert int.from_bytes(raw_b[9:], "big") == (int.from_bytes(raw_a[9:], "big") + 1) % 2**24, "a counter"
    assert xid_bytes(xid_new(now=1_700_000_000))[:4] == (1_700_000_000).to_bytes(4, "big"), "Unix seconds first"


def test_forked_children_do_not_repeat_the_parents_ids():
    """The reason for not using the epyxid package: its generator keeps the process id and the
    counter across fork, so a gunicorn or qcluster child repeated the parent's next ID."""
    xid_new()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ID, then exit without running the test session's handlers
        os.write(write, xid_new().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    parent = xid_new()
    assert child != parent
    assert xid_bytes(child)[7:9] != xid_bytes(parent)[7:9], "the child's process id bytes are its own"
