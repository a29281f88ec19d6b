"""xid strings (github.com/rs/xid): job IDs as the API shows them, and new message IDs.

An xid is 12 bytes written as 20 characters of base32hex ``[0-9a-v]``; webhook-broker's clients
decode job IDs as ``xid.ID``. Job IDs map one-to-one to the job's bigint key with no lookup
table and no database: 4 check bytes + the key's 8 bytes, big-endian. The check bytes stand where
xid keeps its creation time; they are a CRC-32 of the key, so a job ID is checked without a query
(the pull and ack paths stay one statement, and their rows need no creation time) and a
mistyped ID names no job instead of another one. ``xid.ID.Time()`` of a job ID means nothing.
Parsing accepts exactly the strings ``job_xid`` writes: anything else (an integer string, other
check bytes, a non-canonical last character, upper case, non-ASCII) is None, i.e. a 404.

Generated message IDs are real xids (``xid.New``: time, machine, process id, counter). Not the
``epyxid`` package: its generator keeps the parent's process id and counter across ``fork``, so
gunicorn or qcluster children would repeat each other's IDs (seen here: parent and child printed
the same xid); this one resets both in every forked child.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import secrets
import socket
import time
import zlib

XID_LENGTH = 20
ALPHABET = "0123456789abcdefghijklmnopqrstuv"  # base32hex, lower case (rs/xid)
_PAIRS = [a + b for a in ALPHABET for b in ALPHABET]  # 10 bits -> 2 characters
_SHIFTS = tuple(range(90, -1, -10))
# 19 characters, then one whose 4 unused low bits are zero (rs/xid rejects the others)
_CANONICAL = re.compile(r"[0-9a-v]{19}[0g]")
_CHECK_SEED = 0x6A6F6221  # CRC-32 start value: the check of job IDs only
_MAX_PK = 2**63 - 1


def _encode_int(value: int) -> str:
    """The 96-bit integer ``value`` (12 bytes, big-endian) as rs/xid writes it: the same text as
    ``base64.b32hexencode`` without padding, lower case, at a fraction of its cost (this runs once
    per job in every pull answer)."""
    value <<= 4
    return "".join([_PAIRS[(value >> shift) & 0x3FF] for shift in _SHIFTS])


def _decode_int(text) -> int | None:
    """The 96-bit integer of a canonical xid string, else None."""
    if not isinstance(text, str) or len(text) != XID_LENGTH or not _CANONICAL.fullmatch(text):
        return None
    return int(text, 32) >> 4


def xid_bytes(text) -> bytes | None:
    """The 12 bytes of a canonical xid string (any xid), else None."""
    value = _decode_int(text)
    return None if value is None else value.to_bytes(12, "big")


def _check(pk: int) -> int:
    # CRC-32 of the key: detects every error confined to 32 consecutive bits, so a mistyped
    # character (5 bits) never names another job
    return zlib.crc32(pk.to_bytes(8, "big"), _CHECK_SEED)


def job_xid(pk: int) -> str:
    """The job ID the API shows for the job with primary key ``pk``."""
    return _encode_int(_check(pk) << 64 | pk)


def job_pk(text) -> int | None:
    """The primary key named by a job ID, or None when ``text`` is not one ``job_xid`` wrote."""
    value = _decode_int(text)
    if value is None:
        return None
    pk = value & 0xFFFFFFFFFFFFFFFF
    if not 0 < pk <= _MAX_PK or value >> 64 != _check(pk):
        return None
    return pk


# --- new xids (message IDs) ------------------------------------------------------------------------

def _machine_id() -> int:
    """3 bytes identifying the host, as rs/xid: a digest of the platform's machine id, else of the
    host name, else random."""
    for path in ("/etc/machine-id", "/sys/class/dmi/id/product_uuid"):
        try:
            with open(path, "rb") as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value:
            return int.from_bytes(hashlib.md5(value, usedforsecurity=False).digest()[:3], "big")
    name = socket.gethostname().encode()
    digest = hashlib.md5(name, usedforsecurity=False).digest() if name else secrets.token_bytes(3)
    return int.from_bytes(digest[:3], "big")


def _process_id() -> int:
    """The pid, mixed (as rs/xid does) with the cpuset inside a container, where pids repeat."""
    pid = os.getpid()
    try:
        with open("/proc/self/cpuset", "rb") as fh:
            cpuset = fh.read().strip()
    except OSError:
        cpuset = b""
    if cpuset and cpuset != b"/":
        pid ^= zlib.crc32(cpuset)
    return pid & 0xFFFF


_MACHINE = _machine_id()
_PID = _process_id()
_counter = itertools.count(int.from_bytes(secrets.token_bytes(3), "big"))


def _after_fork() -> None:
    global _PID, _counter
    _PID = _process_id()
    _counter = itertools.count(int.from_bytes(secrets.token_bytes(3), "big"))


os.register_at_fork(after_in_child=_after_fork)


def xid_new(now: float | None = None) -> str:
    """A new xid (``xid.New``): 4 bytes of Unix seconds, 3 of machine, 2 of process id and a
    3-byte counter that starts at a random value (``next`` on itertools.count is atomic)."""
    seconds = int(time.time() if now is None else now) & 0xFFFFFFFF
    return _encode_int(seconds << 64 | _MACHINE << 40 | _PID << 24 | next(_counter) & 0xFFFFFF)
