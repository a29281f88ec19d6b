"""Seed channels, producers and consumers from webhook-broker's INI format (idempotent).

    [initial-channels]        id=Name
    [initial-producers]       id=Name
    [initial-consumers]       consumerId=callbackURL   (empty for a pull consumer)
    [initial-channel-tokens]  id=token
    [initial-producer-tokens] id=token
    [initial-producer-rate-limits] id=rateLimitPerSecond[,burst]   (flow control)
    [initial-channel-retention] id=retention  (90s, 15m, 12h, 7d or seconds; empty: BROKER_RETENTION)
    [initial-channel-message-ttl] id=seconds  (the channel's messageTTL)
    [initial-channel-event-types] id=open|closed  (the channel's eventTypes; issue 37)
    [event-type:<channelId>/<type>] description=, schema=, example=, deprecated=  (eventtypes.seed)
    [prune]                   message-retention-days=N (webhook-broker's key: BROKER_RETENTION in days,
                              read at start-up by broker.settings; a bad value is reported here)
    [<consumerId>]            token=, channel=, type=push|pull (empty = push), name=,
                              maxInFlight=, maxDeliveriesPerSecond=, maxAckPending=, maxQueued=, ordered=,
                              notifyInterval= (doorbell seconds > 0; a pull consumer with a
                              callback URL in [initial-consumers] gets the doorbell),
                              messageTypes= (filters: comma-separated type patterns; empty = all),
                              filter= (content filter: a JSON object on one line; empty = none),
                              connectionTimeout=, maxRetry=, retryBackoff=, signingSecret=, paused=,
                              priorityPolicy=, priorityGroups=, priorityTimeout=,
                              circuitBreakerFailures=, circuitBreakerProbeSeconds=,
                              circuitBreakerOpenAfterSeconds= (as the consumer PUT takes them)

Apps above this one keep their part of the registry in the same file through ``SEED_SECTIONS``
(``seed_section_register`` from their ``AppConfig.ready()``): the inbound sources'
``[source:<channel>/<name>]`` sections (sources/seed.py).

``manage.py broker_export`` (consumers.export) writes this format back from a database, every
setting included, so a registry is kept as code and restored with ``seed``.

A consumer with an invalid type, an unknown channel or a bad callback URL is skipped with a
logged error (as the pull-consumer spec says); the rest of the file still applies.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from broker.durations import retention_parse
from broker.errors import DomainError
from broker.message_types import message_types_parse
from broker.models import Channel, Producer, SeedState
from broker.netpolicy import CallbackDenied, callback_url_check
from broker.registry import db_now, row_update
from consumers.filters import filter_parse
from consumers.models import Consumer
from consumers.priority import priority_config_parse
from consumers.services import retry_backoff_parse, signing_secret_generate, signing_secret_validate
from eventtypes.seed import event_types_seed_apply, event_types_seed_parse

logger = logging.getLogger("broker.services.seed")  # its name before the move: what operators filter on


@dataclass
class AppliedSeed:
    """The seed this process applied (``/_status``): brokers sharing a database each show
    their own, where the database row only knows the last one applied by anybody."""

    digest: str
    data: dict
    applied_at: datetime


_applied: AppliedSeed | None = None


def seed_applied() -> AppliedSeed | None:
    """What this process applied, or None. gunicorn applies BROKER_SEED_CONFIG in its master
    before forking, so every worker of an instance answers the same."""
    return _applied


@dataclass(frozen=True)
class SeedSection:
    """A part of the registry an app above this one keeps in the seed file: ``parse(ini, errors)``
    reads it (problems appended to ``errors``, never raised), ``apply(items)`` writes it inside the
    seed's transaction (returns how many were created), ``public(items)`` is it without secrets
    (/_status), ``export(with_secrets)`` its INI sections [(name, [(key, value)])] for broker_export."""

    key: str
    parse: Callable
    apply: Callable
    public: Callable
    export: Callable


SEED_SECTIONS: list[SeedSection] = []


def seed_section_register(section: SeedSection) -> None:
    """Add an app's part of the seed file (from its ``AppConfig.ready()``; once per key)."""
    if all(s.key != section.key for s in SEED_SECTIONS):
        SEED_SECTIONS.append(section)


@dataclass
class SeedPlan:
    channels: dict = field(default_factory=dict)  # id -> {"name", "token"}
    producers: dict = field(default_factory=dict)
    consumers: dict = field(default_factory=dict)  # id -> {"channel", "name", "token", "callback_url", "type", ...}
    event_types: dict = field(default_factory=dict)  # (channel id, type) -> fields (eventtypes.seed)
    errors: list = field(default_factory=list)
    sections: dict = field(default_factory=dict)  # SeedSection key -> what its parse returned

    def digest(self) -> str:
        data = {"channels": self.channels, "producers": self.producers, "consumers": self.consumers,
                **({"event_types": self._event_types()} if self.event_types else {})}
        data.update({key: items for key, items in self.sections.items() if items})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def _event_types(self) -> dict:
        return {f"{cid}/{name}": fields for (cid, name), fields in self.event_types.items()}

    def public(self) -> dict:
        """The plan without tokens or secrets (for /_status)."""
        strip = lambda d: {k: {f: v for f, v in o.items() if f not in ("token", "signing_secret")} for k, o in d.items()}  # noqa: E731
        public = {"channels": strip(self.channels), "producers": strip(self.producers),
                  "consumers": strip(self.consumers),
                  **({"event_types": self._event_types()} if self.event_types else {})}
        for section in SEED_SECTIONS:
            if self.sections.get(section.key):
                public[section.key] = section.public(self.sections[section.key])
        return public


def _section(ini, name: str) -> dict:
    return dict(ini.items(name)) if ini.has_section(name) else {}


def _registered(ini, kind: str, errors: list) -> dict:
    """``[initial-<kind>s]`` id=Name with their tokens from ``[initial-<kind>-tokens]``; one without
    a token is skipped with an error."""
    tokens = _section(ini, f"initial-{kind}-tokens")
    found = {}
    for key, name in _section(ini, f"initial-{kind}s").items():
        token = tokens.get(key, "").strip()
        if not token:
            errors.append(f"{kind} {key}: no token in [initial-{kind}-tokens], skipped")
            continue
        found[key] = {"name": name.strip() or key, "token": token}
    return found


def seed_parse(text: str) -> SeedPlan:
    """Parse the INI text into a plan; problems are collected in ``plan.errors``, never raised."""
    plan = SeedPlan()
    ini = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    ini.optionxform = str
    try:
        ini.read_string(text)
    except configparser.Error as exc:
        plan.errors.append(f"invalid INI: {exc}")
        return plan
    plan.channels = _registered(ini, "channel", plan.errors)
    _retention_parse(ini, plan)
    plan.event_types = event_types_seed_parse(ini, plan.channels, plan.errors)
    plan.producers = _registered(ini, "producer", plan.errors)
    for pid in plan.producers:
        limit = _section(ini, "initial-producer-rate-limits").get(pid, "").strip()
        if limit:
            try:
                parts = [x.strip() for x in limit.split(",")]
                rate = float(parts[0])
                burst = int(parts[1]) if len(parts) > 1 and parts[1] else None
                if not 0 < rate < 1e9 or (burst is not None and burst < 1):
                    raise ValueError
            except ValueError:
                plan.errors.append(f"producer {pid}: rate limit {limit!r} is not rate[,burst], ignored")
            else:
                plan.producers[pid]["rate_limit_per_second"] = rate
                plan.producers[pid]["burst"] = burst
    for cid, url in _section(ini, "initial-consumers").items():
        options = _section(ini, cid)
        url = url.strip()
        ctype = options.get("type", "").strip() or "push"
        if ctype not in ("push", "pull"):
            plan.errors.append(f"consumer {cid}: invalid type {ctype!r}, skipped")
            continue
        channel = options.get("channel", "").strip()
        if channel not in plan.channels:
            plan.errors.append(f"consumer {cid}: channel {channel!r} is not a seeded channel, skipped")
            continue
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                plan.errors.append(f"consumer {cid}: callback URL {url!r} is not absolute, skipped")
                continue
        elif ctype == "push":
            plan.errors.append(f"consumer {cid}: a push consumer needs a callback URL, skipped")
            continue
        consumer = {"channel": channel, "name": options.get("name", "").strip() or cid,
                    "token": options.get("token", "").strip(), "callback_url": url, "type": ctype}
        try:
            if options.get("maxInFlight", "").strip():
                consumer["max_in_flight"] = max(1, int(options["maxInFlight"]))
            if options.get("maxDeliveriesPerSecond", "").strip():
                consumer["max_deliveries_per_second"] = float(options["maxDeliveriesPerSecond"])
            if options.get("maxAckPending", "").strip():
                consumer["max_ack_pending"] = max(1, int(options["maxAckPending"]))
            if options.get("maxQueued", "").strip():
                consumer["max_queued"] = max(1, int(options["maxQueued"]))
            if options.get("notifyInterval", "").strip():
                consumer["notify_interval"] = float(options["notifyInterval"])
                if not 0 < consumer["notify_interval"] < 1e9:
                    raise ValueError("notifyInterval")
        except ValueError:
            plan.errors.append(f"consumer {cid}: maxInFlight/maxDeliveriesPerSecond/maxAckPending/maxQueued/"
                               f"notifyInterval must be (positive) numbers, skipped")
            continue
        ordered = options.get("ordered", "").strip().lower()
        if ordered:  # partitions: one job of a partition in flight at a time, in publish order
            if ordered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                plan.errors.append(f"consumer {cid}: ordered must be true or false, skipped")
                continue
            consumer["ordered"] = ordered in ("true", "1", "yes", "on")
        try:  # filters: type patterns (broker.message_types); absent: left as they are
            if "messageTypes" in options:
                consumer["message_types"] = message_types_parse(options["messageTypes"]) or None
            if "filter" in options:  # content filters (consumers.filters): JSON on one line; empty: none
                consumer["filter"] = filter_parse(options["filter"])
        except DomainError as exc:
            plan.errors.append(f"consumer {cid}: {exc.detail}, skipped")
            continue
        try:
            consumer.update(_consumer_settings(options, ctype))
        except (DomainError, ValueError) as exc:
            plan.errors.append(f"consumer {cid}: {getattr(exc, 'detail', exc)}, skipped")
            continue
        if not consumer["token"]:
            plan.errors.append(f"consumer {cid}: no token, skipped")
            continue
        plan.consumers[cid] = consumer
    for section in SEED_SECTIONS:
        plan.sections[section.key] = section.parse(ini, plan.errors)
    return plan


_NUMBERS = {  # seed key -> (model field, type, smallest value allowed)
    "connectionTimeout": ("connection_timeout", float, 0.001),
    "maxRetry": ("max_retry", int, 0),
    "circuitBreakerFailures": ("circuit_breaker_failures", int, 0),
    "circuitBreakerProbeSeconds": ("circuit_breaker_probe_seconds", float, 0.001),
    "circuitBreakerOpenAfterSeconds": ("circuit_breaker_open_after_seconds", float, 0.0),
}
_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _consumer_settings(options: dict, ctype: str) -> dict:
    """The consumer PUT's other settings (the same parsers); a key left out keeps the value."""
    found = {}
    for key, (name, cast, low) in _NUMBERS.items():
        raw = options.get(key, "").strip()
        if raw:
            value = cast(raw)
            if not low <= value < 1e9:
                raise ValueError(f"{key} out of range")
            found[name] = value
    if options.get("retryBackoff", "").strip():
        found["retry_backoff"] = retry_backoff_parse(options["retryBackoff"])
    if options.get("signingSecret", "").strip():
        found["signing_secret"] = signing_secret_validate(options["signingSecret"].strip())
    if options.get("paused", "").strip():
        if options["paused"].strip().lower() not in _BOOLEANS:
            raise ValueError("paused must be true or false")
        found["paused"] = _BOOLEANS[options["paused"].strip().lower()]
    priority = {k: options[k] for k in ("priorityPolicy", "priorityGroups", "priorityTimeout") if k in options}
    if priority:
        found.update(priority_config_parse(priority, consumer_type=ctype))
    return found


def _retention_parse(ini, plan: SeedPlan) -> None:
    """Retention: ``[initial-channel-retention]`` per channel (a bad one is left out with an error),
    ``[prune] message-retention-days`` checked (broker.settings reads it at start-up)."""
    for cid, raw in _section(ini, "initial-channel-retention").items():
        if cid not in plan.channels:
            plan.errors.append(f"channel {cid}: retention for a channel not in [initial-channels], ignored")
            continue
        try:
            plan.channels[cid]["retention"] = retention_parse(raw, field=f"channel {cid} retention")
        except DomainError as exc:
            plan.errors.append(f"{exc.detail}, ignored")
    for cid, raw in _section(ini, "initial-channel-message-ttl").items():
        if cid not in plan.channels:
            plan.errors.append(f"channel {cid}: message TTL for a channel not in [initial-channels], ignored")
        elif raw.strip():
            if not raw.strip().isdigit() or not 1 <= int(raw) <= 31_536_000:
                plan.errors.append(f"channel {cid}: message TTL {raw!r} is not 1 to 31536000 seconds, ignored")
            else:
                plan.channels[cid]["message_ttl"] = int(raw)
    days = _section(ini, "prune").get("message-retention-days", "").strip()
    if days and not (days.isdigit() and int(days) > 0):
        plan.errors.append(f"[prune] message-retention-days {days!r} is not a positive number of days, ignored")


def _apply_row(model, lookup: dict, values: dict):
    """Create the row, or update the fields that differ from the seed."""
    obj = model.objects.filter(**lookup).first()
    if obj is None:
        return model.objects.create(**lookup, **values, updated_at=db_now()), True
    changed = {k: v for k, v in values.items() if getattr(obj, k) != v}
    if changed:
        row_update(model=model, pk=obj.pk, values=changed)
    return obj, False


def seed_apply(plan: SeedPlan) -> dict:
    """Upsert everything in the plan in one transaction and record it. Returns counts."""
    for error in plan.errors:
        logger.error("seed: %s", error)
    created = {"channels": 0, "producers": 0, "consumers": 0}
    with transaction.atomic():
        channels = {}
        for cid, values in plan.channels.items():
            channels[cid], new = _apply_row(Channel, {"channel_id": cid}, values)
            created["channels"] += new
        if plan.event_types or any("event_types" in values for values in plan.channels.values()):
            created["event_types"] = event_types_seed_apply(channels, plan.event_types)
        for pid, values in plan.producers.items():
            _, new = _apply_row(Producer, {"producer_id": pid}, values)
            created["producers"] += new
        for cid, values in plan.consumers.items():
            values = dict(values)
            if values.get("callback_url"):
                try:  # the callback policy applies to seeded consumers too (broker.netpolicy)
                    callback_url_check(values["callback_url"])
                except CallbackDenied as exc:
                    logger.error("seed: consumer %s skipped: %s", cid, exc)
                    continue
            channel = channels[values.pop("channel")]
            existing = Consumer.objects.filter(channel=channel, consumer_id=cid).exists()
            if not existing and not values.get("signing_secret"):
                values["signing_secret"] = signing_secret_generate()
            _, new = _apply_row(Consumer, {"channel": channel, "consumer_id": cid}, values)
            created["consumers"] += new
        for section in SEED_SECTIONS:
            if plan.sections.get(section.key):
                created[section.key] = section.apply(plan.sections[section.key])
        applied = AppliedSeed(digest=plan.digest(), data=plan.public(), applied_at=timezone.now())
        SeedState.objects.update_or_create(
            pk=1, defaults={"data_hash": applied.digest, "data": applied.data, "applied_at": applied.applied_at})
    global _applied
    _applied = applied
    return created


def seed_from_file(path: str) -> tuple[SeedPlan, dict]:
    with open(path, encoding="utf-8") as fh:
        plan = seed_parse(fh.read())
    return plan, seed_apply(plan)

