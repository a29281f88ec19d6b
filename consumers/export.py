"""The registry as a seed file: ``registry_export`` writes every channel, producer and consumer
with all their settings (priority groups, retention, message TTL, flow control, filters, circuit
breaker), the channels' event types (eventtypes.seed) and the parts the apps above keep there
(``consumers.seed.SEED_SECTIONS``: the inbound sources), in the INI format ``consumers.seed`` reads, so ``manage.py broker_export`` then
``manage.py seed`` on an empty database gives the same registry (tests/consumers/test_export.py).

Tokens and signing secrets are written only with ``with_secrets``; without them the file names
where they go (a comment) and is for review and diffs, not for a restore. A value left at its
model default is still written, so a seed over an existing registry sets it back; a setting that
is unset (null) is left out, as the seed leaves out keys it is not given.
"""

from __future__ import annotations

import json

from broker.models import Channel, Producer
from consumers.models import Consumer
from consumers.seed import SEED_SECTIONS
from eventtypes.seed import MODES_SECTION, event_types_export

HEADER = """; The broker's registry, written by `manage.py broker_export`{secrets}.
; Restore (or apply to another broker) with `manage.py seed --config FILE`; the format is
; webhook-broker's seed INI with the broker's extra keys (consumers/seed.py lists them).
"""


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _section(lines: list[str], name: str, items: list[tuple[str, str]]) -> None:
    if items:
        lines.append(f"[{name}]")
        lines += [f"{key}={value}" for key, value in items]
        lines.append("")


def registry_export(*, with_secrets: bool = False) -> tuple[str, list[str]]:
    """The seed INI text, and the problems met (a consumer id used on two channels: the seed
    format names a consumer by its id alone, so only the first one is written)."""
    secret = (lambda value: value) if with_secrets else (lambda value: "")
    channels = list(Channel.objects.order_by("channel_id"))
    producers = list(Producer.objects.order_by("producer_id"))
    consumers = list(Consumer.objects.select_related("channel").order_by("consumer_id", "channel__channel_id"))
    problems, seen, kept = [], set(), []
    for consumer in consumers:
        if consumer.consumer_id in seen:
            problems.append(f"consumer {consumer.consumer_id} of channel {consumer.channel.channel_id} left out: "
                            "the seed format names consumers by id, and another channel has one with this id")
            continue
        seen.add(consumer.consumer_id)
        kept.append(consumer)

    lines = [HEADER.format(secrets=" with secrets" if with_secrets else " without secrets (tokens and signing "
                                                                       "secrets left empty: --with-secrets)")]
    _section(lines, "initial-channels", [(c.channel_id, c.name) for c in channels])
    _section(lines, "initial-producers", [(p.producer_id, p.name) for p in producers])
    _section(lines, "initial-consumers", [(k.consumer_id, k.callback_url) for k in kept])
    _section(lines, "initial-channel-tokens", [(c.channel_id, secret(c.token)) for c in channels])
    _section(lines, "initial-producer-tokens", [(p.producer_id, secret(p.token)) for p in producers])
    _section(lines, "initial-producer-rate-limits", [
        (p.producer_id, _number(p.rate_limit_per_second) + (f",{p.burst}" if p.burst else ""))
        for p in producers if p.rate_limit_per_second is not None])
    _section(lines, "initial-channel-retention", [(c.channel_id, str(c.retention)) for c in channels
                                                  if c.retention is not None])
    _section(lines, "initial-channel-message-ttl", [(c.channel_id, str(c.message_ttl)) for c in channels
                                                    if c.message_ttl is not None])
    modes, event_type_sections = event_types_export(channels)  # issue 37: eventTypes, event types
    _section(lines, MODES_SECTION, modes)
    for name, items in event_type_sections:
        _section(lines, name, items)
    for k in kept:
        _section(lines, k.consumer_id, _consumer_items(k, secret))
    for part in SEED_SECTIONS:  # the apps above that keep their part in the seed file (sources)
        for name, items in part.export(with_secrets):
            _section(lines, name, items)
    return "\n".join(lines).rstrip() + "\n", problems


def _consumer_items(k: Consumer, secret) -> list[tuple[str, str]]:
    items = [("token", secret(k.token)), ("channel", k.channel.channel_id), ("type", k.type), ("name", k.name),
             ("maxInFlight", _number(k.max_in_flight)), ("maxAckPending", _number(k.max_ack_pending)),
             ("notifyInterval", _number(k.notify_interval)), ("ordered", str(k.ordered).lower()),
             ("paused", str(k.paused).lower()), ("messageTypes", ",".join(k.message_types or [])),
             ("filter", json.dumps(k.filter, separators=(",", ":"), sort_keys=True) if k.filter else ""),
             ("circuitBreakerFailures", _number(k.circuit_breaker_failures)),
             ("circuitBreakerProbeSeconds", _number(k.circuit_breaker_probe_seconds)),
             ("circuitBreakerOpenAfterSeconds", _number(k.circuit_breaker_open_after_seconds))]
    optional = [("maxDeliveriesPerSecond", k.max_deliveries_per_second), ("maxQueued", k.max_queued),
                ("connectionTimeout", k.connection_timeout), ("maxRetry", k.max_retry)]
    items += [(key, _number(value)) for key, value in optional if value is not None]
    if k.retry_backoff:
        items.append(("retryBackoff", k.retry_backoff))
    if k.priority_policy and k.priority_policy != "none":
        items += [("priorityPolicy", k.priority_policy), ("priorityGroups", ",".join(k.priority_groups or []))]
        if k.priority_timeout is not None:
            items.append(("priorityTimeout", _number(k.priority_timeout)))
    if secret(k.signing_secret):
        items.append(("signingSecret", k.signing_secret))
    return items
