"""Consumer registry: create, update and delete consumers of a channel."""

from __future__ import annotations

import base64
import secrets
from urllib.parse import urlsplit

from django.db import connection, transaction

from broker.counters import JOB, counters_forget
from broker.errors import InvalidInput, PreconditionFailed
from broker.netpolicy import CallbackDenied, callback_url_check
from broker.registry import Precondition, row_upsert
from consumers.models import Consumer
from consumers.queries import Q


def signing_secret_generate() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def signing_secret_validate(secret: str) -> str:
    raw = secret[6:] if secret.startswith("whsec_") else secret
    try:
        decoded = base64.b64decode(raw, validate=True)
    except (ValueError, base64.binascii.Error):
        raise InvalidInput("invalid_signing_secret", "signingSecret must be whsec_ followed by base64") from None
    if not 24 <= len(decoded) <= 64:
        raise InvalidInput("invalid_signing_secret", "signingSecret must decode to 24-64 bytes")
    return "whsec_" + raw


CALLBACK_URL_MAX = 2048  # Consumer.callback_url


def callback_url_validate(url: str) -> str:
    if len(url) > CALLBACK_URL_MAX or "\x00" in url:
        raise InvalidInput("invalid_callback_url", f"callbackUrl must be an absolute http(s) URL of at most "
                                                   f"{CALLBACK_URL_MAX} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port or IPv6 literal raises ValueError: a 400, not a 500
    except ValueError:
        raise InvalidInput("invalid_callback_url", "callbackUrl must be an absolute http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInput("invalid_callback_url", "callbackUrl must be an absolute http(s) URL")
    try:  # no loopback / private / link-local targets unless allowed (broker.netpolicy)
        callback_url_check(url)
    except CallbackDenied as exc:
        raise InvalidInput("callback_url_not_allowed", str(exc)) from None
    return url


def consumer_type_parse(value: str | None) -> str | None:
    """'' or missing = push (None: keep on update); anything but push/pull is a 400."""
    if value is None:
        return None
    value = value.strip()
    if value == "":
        return Consumer.Type.PUSH
    if value not in (Consumer.Type.PUSH, Consumer.Type.PULL):
        raise InvalidInput("invalid_consumer_type", "type must be push or pull")
    return value


def retry_backoff_parse(raw: str) -> str:
    """A consumer's retryBackoff (comma-separated seconds, each 0 <= s < 1e9: NaN and infinity fail
    too) in its stored form; 400 ``invalid_retryBackoff`` otherwise. The API and the admin form."""
    try:
        steps = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        steps = []
    if not steps or any(not 0 <= s < 1e9 for s in steps):
        raise InvalidInput("invalid_retryBackoff", "retryBackoff must be comma-separated seconds")
    stored = ",".join(f"{s:g}" for s in steps)
    if len(stored) > 255:  # the column's length
        raise InvalidInput("invalid_retryBackoff", "retryBackoff is longer than 255 characters")
    return stored


def consumer_upsert(*, channel, consumer_id: str, name: str | None, token: str | None,
                    callback_url: str | None, type: str | None, settings: dict,
                    precondition: Precondition) -> tuple[Consumer, bool]:
    """PUT semantics: create, or update under If-Unmodified-Since (both answered 200).

    ``settings`` holds already-validated model fields (max_in_flight, signing_secret, ...).
    A push consumer needs an absolute callback URL; a pull consumer needs none.
    """
    existing = Consumer.objects.filter(channel=channel, consumer_id=consumer_id).first()
    consumer_type = type or (existing.type if existing else Consumer.Type.PUSH)
    effective_url = callback_url if callback_url is not None else (existing.callback_url if existing else "")
    if effective_url:
        callback_url_validate(effective_url)
    elif consumer_type == Consumer.Type.PUSH:
        raise InvalidInput("callback_url_required", "a push consumer needs an absolute callbackUrl")
    fields = dict(settings)
    if name:
        fields["name"] = name
    if callback_url is not None:
        fields["callback_url"] = callback_url
    if type is not None:
        fields["type"] = type
    create_defaults = {"name": consumer_id, "signing_secret": signing_secret_generate()}
    return row_upsert(model=Consumer, key_field="consumer_id", key=consumer_id, fields=fields,
                      token=token, precondition=precondition, extra_where={"channel": channel},
                      create_defaults=create_defaults)


def consumer_delete(*, consumer: Consumer, precondition: Precondition) -> None:
    """Delete a consumer and its jobs, under If-Unmodified-Since."""
    since = precondition.epoch()
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(Q.consumer_lock_unmodified.sql, [consumer.pk, since])
            if cur.fetchone() is None:
                raise PreconditionFailed("precondition_failed", "the consumer was modified since If-Unmodified-Since")
            cur.execute(Q.consumer_jobs_delete.sql, {"consumer": consumer.pk})
            cur.execute(Q.consumer_waiters_delete.sql, [consumer.pk])
            cur.execute(Q.consumer_delete.sql, [consumer.pk])
        counters_forget(scope=JOB, owner_id=consumer.pk)


def consumer_rotate_secret(*, consumer: Consumer, grace_seconds: float = 24 * 3600) -> str:
    """New signing secret; the old one keeps being sent alongside for ``grace_seconds``."""
    new = signing_secret_generate()
    with connection.cursor() as cur:
        cur.execute(Q.consumer_rotate_secret.sql, [grace_seconds, new, consumer.pk])
    return new


def consumer_pause(*, consumer: Consumer, paused: bool) -> Consumer:
    """Flow control: pause (nothing pushed or handed to pulls; jobs keep accumulating) or resume.
    Resuming NOTIFYs the consumer's waiters and the push dispatchers, so delivery starts at once."""
    with connection.cursor() as cur:
        cur.execute(Q.consumer_pause.sql, [paused, consumer.pk])
        row = cur.fetchone()
        if not paused:
            cur.execute(Q.consumer_notify.sql, [str(consumer.pk)])
    consumer.paused = paused
    if row:
        consumer.updated_at = row[0]
    return consumer
