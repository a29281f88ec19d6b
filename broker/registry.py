"""Create and update channels and producers (PUT upserts with optimistic concurrency)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, F, Func, Value
from django.db.models.functions import Greatest
from django.utils.http import parse_http_date_safe

from broker.db.run import query_fetchone
from broker.errors import InvalidInput, PreconditionFailed
from broker.models import Channel, Producer
from broker.queries import Q
from broker.tokens import token_generate

SECOND = timedelta(seconds=1)
_LAST_SECOND = datetime.max.replace(tzinfo=timezone.utc) - SECOND


def _bumped_updated_at():
    """``GREATEST(now(), date_trunc('second', updated_at) + interval '1 second')``: every
    successful update moves updated_at to the next whole second at least, so the http-date in
    Last-Modified (second precision) changes on every update and a second writer holding the old
    If-Unmodified-Since is always refused with 412."""
    truncated = Func(Value("second"), F("updated_at"), function="date_trunc", output_field=DateTimeField())
    # now(), the transaction's time (as db_now): Django's Now() is statement_timestamp()
    now = Func(function="now", output_field=DateTimeField())
    return Greatest(now, truncated + SECOND, output_field=DateTimeField())


TEXT_MAX = 255  # ids, names and tokens: the columns' length (OpenAPI: maxLength)


def text_check(value: str | None, *, label: str, code: str, max_length: int = TEXT_MAX) -> None:
    """An id, name or token the database can hold: at most ``max_length`` characters and no NUL
    (PostgreSQL text cannot store it); anything else is a 400 ``code``, never a failed INSERT."""
    if value is None:
        return
    if len(value) > max_length:
        raise InvalidInput(code, f"{label} is longer than {max_length} characters")
    if "\x00" in value:
        raise InvalidInput(code, f"{label} must not contain NUL characters")


@dataclass
class Precondition:
    """The If-Unmodified-Since header of an update, parsed."""

    raw: str | None

    def epoch(self) -> int:
        if not self.raw:
            raise InvalidInput("precondition_required", "If-Unmodified-Since header is required for an update")
        value = parse_http_date_safe(self.raw)
        if value is None:
            raise InvalidInput("invalid_precondition", "If-Unmodified-Since is not a valid HTTP date")
        return value


def row_upsert(*, model, key_field: str, key: str, fields: dict, token: str | None,
               precondition: Precondition, extra_where: dict | None = None,
               create_defaults: dict | None = None) -> tuple[object, bool]:
    """Insert the row, or update it when ``precondition`` matches its current Last-Modified.

    Returns (instance, created). The update is one conditional UPDATE, so of two concurrent
    writers with the same If-Unmodified-Since exactly one wins; the other gets 412.
    """
    text_check(key, label="the id", code="invalid_id")
    text_check(fields.get("name"), label="name", code="invalid_name")
    text_check(token, label="token", code="invalid_token")
    lookup = {key_field: key, **(extra_where or {})}
    existing = model.objects.filter(**lookup).only("pk").first()
    if existing is None:
        try:
            with transaction.atomic():
                obj = model.objects.create(**lookup, **{**(create_defaults or {}), **fields},
                                           token=token or token_generate(),
                                           updated_at=db_now())
            return obj, True
        except IntegrityError:
            existing = model.objects.filter(**lookup).only("pk").first()
            if existing is None:
                raise
    since = precondition.epoch()
    sets = dict(fields)
    if token:
        sets["token"] = token
    if not row_update(model=model, pk=existing.pk, values=sets, unmodified_since=since):
        raise PreconditionFailed("precondition_failed", "the resource was modified since If-Unmodified-Since")
    return model.objects.get(pk=existing.pk), False


def row_update(*, model, pk: int, values: dict, unmodified_since: int | None = None) -> bool:
    """UPDATE the row and bump ``updated_at``; with ``unmodified_since`` (epoch seconds) only if
    its Last-Modified still equals it. True when the row was updated.

    One ``UPDATE ... WHERE id = %s AND updated_at >= %s AND updated_at < %s`` through the ORM
    (the Last-Modified second as a range on the column itself, equal to the truncated compare):
    the check and the write are one statement on one row, so of two writers with the same
    If-Unmodified-Since the second re-checks the row the first committed and touches nothing."""
    rows = model.objects.filter(pk=pk)
    if unmodified_since is not None:
        start = datetime.fromtimestamp(unmodified_since, tz=timezone.utc)
        rows = rows.filter(updated_at__gte=start)
        if start < _LAST_SECOND:  # the HTTP date's last second (31 Dec 9999) has no end to add
            rows = rows.filter(updated_at__lt=start + SECOND)
    return rows.update(**values, updated_at=_bumped_updated_at()) == 1


def db_now() -> datetime:
    """The database clock to the millisecond (a new row's updated_at)."""
    return query_fetchone(Q.db_now_ms)[0]


def channel_upsert(*, channel_id: str, name: str | None, token: str | None, precondition: Precondition,
                   settings: dict | None = None):
    """``settings``: validated model fields (message_ttl, retention)."""
    fields = {"name": name} if name else {}
    fields.update(settings or {})
    return row_upsert(model=Channel, key_field="channel_id", key=channel_id,
                      fields=fields, create_defaults={"name": channel_id},
                      token=token, precondition=precondition)


def producer_upsert(*, producer_id: str, name: str | None, token: str | None, precondition: Precondition,
                    rate: dict | None = None):
    """``rate``: validated flow-control fields (rate_limit_per_second, burst); a changed limit
    refills the bucket (its state is reset)."""
    fields = {"name": name} if name else {}
    if rate:
        fields.update(rate, rate_tokens=None, rate_at=None)
    return row_upsert(model=Producer, key_field="producer_id", key=producer_id,
                      fields=fields, create_defaults={"name": producer_id},
                      token=token, precondition=precondition)
