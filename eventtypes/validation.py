"""Validation at publish: ``message_validate``, the one function every publish path calls (the single
publish, the batch per message, a scheduled message when it is created; never a replay or a due
scheduled message, which were validated when they came in), in the request's own process and
before the message's transaction.

What it costs: nothing read per publish. Each process keeps, per channel, whether the channel is
closed and its event types' current versions (one query the first time a channel is published to,
``channel_event_types``), and the validators compiled once per event type and version. Every change
of an event type, a version or a channel's ``eventTypes`` moves the generation number on (triggers,
in the writer's transaction); each process reads it at most every ``CHECK_INTERVAL`` seconds
(``event_types_generation``: one primary-key read) and reloads a channel whose rules are older, so
a change reaches every web process within a second. A channel without event types costs a dict
lookup and a clock read per publish.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import transaction

from broker.db.run import query_fetchall, query_fetchone
from broker.errors import InvalidInput, Unprocessable
from eventtypes.queries import Q
from eventtypes.rules import not_json, payload_fault, schema_compile

logger = logging.getLogger("eventtypes.validation")
CHECK_INTERVAL = 0.5  # seconds between two reads of the generation: a change is seen within a second
CHANNELS_MAX = 10_000  # channels cached per process (publishes to unknown ids could grow it): then cleared
COMPILED_MAX = 10_000
JSON_TYPES = ("application/json", "text/plain", "application/octet-stream", "")


@dataclass(frozen=True)
class ChannelRules:
    """What a channel holds its publishes to, as of ``generation``."""

    generation: int
    closed: bool
    types: dict = field(default_factory=dict)  # name -> (event type pk, version, schema text or None)


@dataclass
class _Cache:
    generation: int = -1
    checked_at: float = float("-inf")
    channels: dict = field(default_factory=dict)  # channel_id -> ChannelRules
    compiled: dict = field(default_factory=dict)  # (event type pk, version) -> validator (versions never change)
    lock: threading.Lock = field(default_factory=threading.Lock)


_cache = _Cache()


def message_validate(*, channel_id: str, message_type: str | None, payload: bytes, content_type: str,
                     rules: ChannelRules | None = None) -> None:
    """Hold one message to its channel's event types: 422 ``schema_validation_failed`` (with
    ``path``, a JSON pointer into the payload) when its type has a schema the payload breaks or the
    payload is not JSON; 422 ``unknown_event_type`` on a ``closed`` channel for a type it has no
    event type for (or no type). A channel that does not exist passes (the publish answers 404).
    ``rules``: the channel's, as ``channel_rules_held`` gave them (else read as needed)."""
    if rules is None:
        rules = channel_rules(channel_id)
    if not rules.types and not rules.closed:
        return
    entry = rules.types.get(message_type) if message_type is not None else None
    if entry is None:
        if rules.closed:
            raise Unprocessable("unknown_event_type", (
                f"channel {channel_id} takes only its event types, and {message_type!r} is not one of them"
                if message_type is not None else
                f"channel {channel_id} takes only its event types: X-Broker-Message-Type is required"))
        return
    pk, version, schema_text = entry
    if schema_text is None:
        return
    validator = _validator(pk, version, schema_text)
    if validator is None:
        return
    instance = _payload_json(payload, content_type, message_type)
    fault = payload_fault(validator, instance)
    if fault is not None:
        message, path = fault
        raise Unprocessable("schema_validation_failed", f"the payload does not match event type {message_type} "
                            f"(version {version}): {message} (at {path or 'the payload itself'})", path=path)


def channel_rules(channel_id: str) -> ChannelRules:
    """The channel's rules as this process holds them, reloaded when the generation moved on since
    they were read (a channel that does not exist: open, without event types)."""
    cache = _cache
    now = time.monotonic()
    if now - cache.checked_at >= CHECK_INTERVAL:
        row = query_fetchone(Q.event_types_generation)
        cache.generation = row[0] if row else 0
        cache.checked_at = now
    rules = cache.channels.get(channel_id)
    if rules is None or rules.generation != cache.generation:  # (!=: a restored database may go back)
        rules = _load(channel_id)
    return rules


def channel_rules_held(channel_id: str, *, within: float = 2 * CHECK_INTERVAL) -> ChannelRules | None:
    """The channel's rules as this process holds them, without a query, when the generation was read
    less than ``within`` seconds ago and the channel loaded at it; else None. For a caller that must
    not block (the web server's event loop): it has ``channel_rules`` called elsewhere meanwhile (a
    change is then still seen within a second) and leaves the other cases to it."""
    cache = _cache
    if time.monotonic() - cache.checked_at >= within:
        return None
    rules = cache.channels.get(channel_id)
    return rules if rules is not None and rules.generation == cache.generation else None


def _load(channel_id: str) -> ChannelRules:
    """One query: the channel's mode and event types, with the generation of the same snapshot."""
    rows = query_fetchall(Q.channel_event_types, [channel_id])
    generation = (rows[0][0] if rows else None) or 0
    types = {name: (pk, version, schema) for _, _, pk, name, version, schema in rows if pk is not None}
    rules = ChannelRules(generation=generation, closed=bool(rows) and rows[0][1] == "closed", types=types)
    if generation > _cache.generation:  # committed and newer than the last check: every other channel reloads
        _cache.generation = generation
    channels = _cache.channels
    if len(channels) >= CHANNELS_MAX:
        channels.clear()
    channels[channel_id] = rules
    return rules


def _validator(pk: int, version: int, schema_text: str):
    """The compiled validator of an event type's version (compiled once per process). A stored schema
    that no longer compiles (a library upgrade) is logged and not enforced: the broker never refuses
    a message for a fault of its own."""
    key = (pk, version)
    validator = _cache.compiled.get(key)
    if validator is None:
        try:
            validator = schema_compile(json.loads(schema_text))
        except (InvalidInput, ValueError) as exc:
            logger.error("event type %s version %s: its stored schema does not compile, not enforced: %s",
                         pk, version, getattr(exc, "detail", exc))
            return None
        with _cache.lock:
            if len(_cache.compiled) >= COMPILED_MAX:
                _cache.compiled.clear()
            _cache.compiled[key] = validator
    return validator


def _payload_json(payload: bytes, content_type: str, message_type: str):
    """The payload as JSON; 422 when its content type names another format or it does not parse."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not (media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))):
        raise Unprocessable("schema_validation_failed", f"event type {message_type} has a schema: its payload must "
                            f"be JSON, not {media}", path="")
    try:
        return json.loads(payload, parse_constant=not_json)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise Unprocessable("schema_validation_failed", f"event type {message_type} has a schema: its payload must "
                            f"be JSON ({str(exc)[:200]})", path="") from None


def rules_changed() -> None:
    """This process changed event types or a channel's eventTypes: its next publish reads the
    generation at once (and again after the commit), not up to CHECK_INTERVAL later."""
    _cache.checked_at = float("-inf")
    transaction.on_commit(_expire)


def _expire() -> None:
    _cache.checked_at = float("-inf")


def cache_clear() -> None:
    """Forget every channel's rules and compiled validator (tests; the next publish reloads)."""
    _cache.channels.clear()
    _cache.compiled.clear()
    _cache.checked_at = float("-inf")
