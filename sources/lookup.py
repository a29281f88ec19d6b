"""A source by its URL id, from a per-process cache renewed within a second of a change.

Receiving a request costs no query for its source in the common case: each process keeps what it
read for ``FRESH_FOR`` seconds (an unknown id too, so a burst of wrong addresses costs one probe a
second each). A change (a secret rotated, a source disabled or deleted) is therefore seen within a
second; what must hold at once is held by the database instead: a publish re-reads its source
row in its own statement (the ``sources_message_check`` trigger), so a deleted or disabled source
never publishes after its DELETE or PUT has answered, whatever this cache still says.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from broker.db.run import query_fetchall
from sources.queries import Q
from sources.rules import spec_parse, DEDUPE_KINDS, TYPE_KINDS, dedupe_spec, type_spec

SOURCES_PRODUCER = "broker-sources"  # the broker-owned producer every source publishes as
FRESH_FOR = 0.9  # seconds a cached source (or its absence) is used without reading it again
STALE_MAX = 2 * FRESH_FOR  # seconds a held source serves a caller that must not block while it is read again
CACHE_MAX = 10_000  # entries; beyond, the cache starts over (a flood of unknown ids)


@dataclass(frozen=True)
class SourceSnapshot:
    """What receiving needs of a source, as read at ``read_at`` (time.monotonic())."""

    pk: int
    source_id: str
    name: str
    channel_pk: int
    channel_id: str
    channel_token: str
    producer_token: str | None
    verify: str
    secret: str
    previous_secret: str
    previous_until: float | None  # Unix time the previous secret stops verifying
    signature_header: str
    algorithm: str
    encoding: str
    signature_prefix: str
    api_key_header: str
    dedupe: tuple[str, str]  # (kind, argument) in force (sources.rules)
    dedupe_window: int
    message_type: tuple[str, str]
    response_status: int
    response_body: str
    response_content_type: str
    enabled: bool
    read_at: float

    def secrets(self, now: float) -> list[str]:
        """The secrets that verify now: the current one, and the previous one during its grace."""
        found = [self.secret] if self.secret else []
        if self.previous_secret and self.previous_until is not None and now < self.previous_until:
            found.append(self.previous_secret)
        return found


def _snapshot(row: tuple, read_at: float) -> SourceSnapshot:
    (pk, source_id, name, channel_pk, channel_id, channel_token, producer_token, verify, secret, previous,
     previous_until, signature_header, algorithm, encoding, prefix, api_key_header, dedupe, window, message_type,
     status, body, content_type, enabled) = row
    return SourceSnapshot(
        pk=pk, source_id=source_id, name=name, channel_pk=channel_pk, channel_id=channel_id,
        channel_token=channel_token, producer_token=producer_token, verify=verify, secret=secret,
        previous_secret=previous, previous_until=float(previous_until) if previous_until is not None else None,
        signature_header=signature_header, algorithm=algorithm, encoding=encoding, signature_prefix=prefix,
        api_key_header=api_key_header,
        dedupe=spec_parse(dedupe_spec(dedupe, verify), kinds=DEDUPE_KINDS, field="dedupe"),
        dedupe_window=window,
        message_type=spec_parse(type_spec(message_type, verify), kinds=TYPE_KINDS, field="messageType"),
        response_status=status, response_body=body, response_content_type=content_type, enabled=enabled,
        read_at=read_at)


class SourceCache:
    """The process's sources by id (threads share it; a race reads the row twice, harmlessly)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, SourceSnapshot | None]] = {}
        self._lock = threading.Lock()

    def get(self, source_id: str, *, fresh: bool = False) -> SourceSnapshot | None:
        """The source (None: no such id), read again when older than FRESH_FOR or ``fresh``."""
        now = time.monotonic()
        entry = self._entries.get(source_id)
        if entry is not None and not fresh and now - entry[0] < FRESH_FOR:
            return entry[1]
        rows = query_fetchall(Q.source_by_id, {"id": source_id, "producer": SOURCES_PRODUCER})
        snapshot = _snapshot(rows[0], now) if rows else None
        with self._lock:
            if len(self._entries) >= CACHE_MAX:
                self._entries.clear()
            self._entries[source_id] = (now, snapshot)
        return snapshot

    def cached(self, source_id: str, within: float) -> SourceSnapshot | None:
        """The source as held, if it is held and was read less than ``within`` ago; else None (never reads)."""
        entry = self._entries.get(source_id)
        if entry is not None and time.monotonic() - entry[0] < within:
            return entry[1]
        return None

    def forget(self, source_id: str) -> None:
        """Drop one entry (this process changed or deleted the source: its next request reads it)."""
        self._entries.pop(source_id, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_cache = SourceCache()


def source_lookup(*, source_id: str, fresh: bool = False) -> SourceSnapshot | None:
    """The source whose URL id is ``source_id`` (None when there is none), at most FRESH_FOR
    seconds old unless ``fresh``."""
    return _cache.get(source_id, fresh=fresh)


def source_cached(*, source_id: str, within: float = STALE_MAX) -> SourceSnapshot | None:
    """The source as this process holds it when it was read less than ``within`` seconds ago,
    without any query (None: not held, too old, or no such source). For a caller that must not
    block (the web server's event loop): it has ``source_lookup`` called elsewhere meanwhile (so a
    change is still seen within about a second) and leaves the other cases to it."""
    return _cache.cached(source_id, within)


def source_forget(*, source_id: str) -> None:
    _cache.forget(source_id)


def sources_cache_clear() -> None:
    """Forget every cached source (tests)."""
    _cache.clear()
