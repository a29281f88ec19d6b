"""Create, update, delete and rotate sources: the services behind ``PUT/DELETE
/channel/{c}/source/{s}``, the admin and the seed.

A source's id (its URL, ``/in/{id}``) is random (192 bits) and stays the same across updates. A
new secret keeps the previous one verifying for ``BROKER_SECRET_ROTATION_GRACE`` (not when
``verify`` changes: the old secret meant another scheme). Updates are compare-and-set on
``updated_at`` when the caller gives If-Unmodified-Since (``broker.registry.row_update``).
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from broker.db.run import query_execute
from broker.errors import InvalidInput, NotFound, PreconditionFailed
from broker.models import Channel
from broker.registry import Precondition, db_now, row_update, text_check
from sources.lookup import SOURCES_PRODUCER, source_forget
from sources.models import Source
from sources.queries import Q
from sources.rules import NAME_MAX, SOURCE_ID, SOURCE_NAME, SourceState, settings_check
from sources.tallies import source_tallies_forget


def source_id_generate() -> str:
    """A new URL id: 192 random bits, URL-safe (``secrets.token_urlsafe``)."""
    return secrets.token_urlsafe(24)


def secret_generate(verify: str) -> str:
    """A secret for a sender that lets the receiver choose one (the admin's rotate): the form
    ``verify`` takes; empty for the providers that issue their own (Stripe, Shopify, Slack)."""
    if verify == "standard-webhooks":
        return "whsec_" + secrets.token_urlsafe(24).replace("-", "+").replace("_", "/")
    if verify == "basic":
        return "broker:" + secrets.token_urlsafe(24)
    if verify in ("github", "hmac", "api-key"):
        return secrets.token_urlsafe(32)
    return ""


def _name_check(name: str) -> None:
    text_check(name, label="the source name", code="invalid_name", max_length=NAME_MAX)
    if not SOURCE_NAME.fullmatch(name):
        raise InvalidInput("invalid_name", "a source name is 1-255 characters, no slash, blank or control character")


def source_of(*, channel: Channel, name: str) -> Source:
    source = Source.objects.filter(channel=channel, name=name).first()
    if source is None:
        raise NotFound("source_not_found", "source not found")
    return source


def _state(source: Source | None, fields: dict) -> SourceState:
    def value(field: str, default: str = "") -> str:
        if field in fields:
            return fields[field]
        return getattr(source, field) if source is not None else default
    return SourceState(verify=value("verify"), secret=value("secret"), signature_header=value("signature_header"),
                       api_key_header=value("api_key_header"))


def source_upsert(*, channel: Channel, name: str, fields: dict, precondition: Precondition | None = None,
                  source_id: str | None = None) -> tuple[Source, bool]:
    """Create the source (True) or update it (False) with ``fields`` (validated model fields,
    ``sources.rules.settings_parse``); 400 for a rule across fields, 412 when If-Unmodified-Since
    (optional) no longer holds. ``source_id``: the URL id to keep (a seed restoring a registry)."""
    _name_check(name)
    if source_id is not None and not SOURCE_ID.fullmatch(source_id):
        raise InvalidInput("invalid_id", "a source id is 22-64 characters of A-Z a-z 0-9 _ -")
    sources_producer_ensure()
    existing = Source.objects.filter(channel=channel, name=name).first()
    if existing is None:
        settings_check(new=_state(None, fields), old=None, fields=fields)
        try:
            with transaction.atomic():
                source = Source.objects.create(channel=channel, name=name, source_id=source_id or source_id_generate(),
                                               updated_at=db_now(), **fields)
            return source, True
        except IntegrityError:
            existing = Source.objects.filter(channel=channel, name=name).first()
            if existing is None:
                raise InvalidInput("invalid_id", "that source id is taken") from None
    settings_check(new=_state(existing, fields), old=_state(existing, {}), fields=fields)
    values = dict(fields)
    if source_id is not None:
        values["source_id"] = source_id
    if "verify" in fields and fields["verify"] != existing.verify:
        values.update(previous_secret="", previous_expires_at=None)
    elif "secret" in fields and fields["secret"] != existing.secret and existing.secret:
        values.update(previous_secret=existing.secret,
                      previous_expires_at=db_now() + timedelta(seconds=float(settings.BROKER_SECRET_ROTATION_GRACE)))
    since = precondition.epoch() if precondition is not None and precondition.raw else None
    try:
        updated = row_update(model=Source, pk=existing.pk, values=values, unmodified_since=since)
    except IntegrityError:
        raise InvalidInput("invalid_id", "that source id is taken") from None
    if not updated:
        if not Source.objects.filter(pk=existing.pk).exists():
            raise NotFound("source_not_found", "source not found")
        raise PreconditionFailed("precondition_failed", "the source was modified since If-Unmodified-Since")
    source_forget(source_id=existing.source_id)
    return Source.objects.get(pk=existing.pk), False


def source_delete(*, source: Source, precondition: Precondition | None = None) -> None:
    """Delete the source. Its URL answers 404 in every process within a second; a request already
    publishing holds the row (``FOR SHARE``), so this waits for it, and none publishes after."""
    since = precondition.epoch() if precondition is not None and precondition.raw else None
    rows = Source.objects.filter(pk=source.pk)
    if since is not None:
        current = rows.values_list("updated_at", flat=True).first()
        if current is not None and int(current.timestamp()) != since:
            raise PreconditionFailed("precondition_failed", "the source was modified since If-Unmodified-Since")
    with transaction.atomic():
        deleted, _ = rows.delete()
        source_tallies_forget(source_pk=source.pk)
    source_forget(source_id=source.source_id)
    if not deleted:
        raise NotFound("source_not_found", "source not found")


def source_enable(*, source: Source, enabled: bool) -> Source:
    """Enable or disable (a disabled source refuses every request: 403 ``source_disabled``)."""
    row_update(model=Source, pk=source.pk, values={"enabled": enabled})
    source_forget(source_id=source.source_id)
    return Source.objects.get(pk=source.pk)


def source_rotate(*, source: Source, secret: str | None = None) -> tuple[Source, str]:
    """A new secret (``secret``, or one generated for the schemes where the receiver chooses it);
    the previous one verifies for BROKER_SECRET_ROTATION_GRACE. Returns the source and the secret,
    shown once."""
    new = secret if secret else secret_generate(source.verify)
    if not new:
        raise InvalidInput("secret_required", f"{source.verify} issues its own secret: give the new one")
    saved, _ = source_upsert(channel=source.channel, name=source.name, fields={"secret": new})
    return saved, new


def sources_producer_ensure() -> None:
    """The producer sources publish as (``broker-sources``), created once."""
    query_execute(Q.sources_producer_create, {"producer": SOURCES_PRODUCER, "token": secrets.token_urlsafe(32)})
