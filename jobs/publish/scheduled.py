"""Scheduled messages: publish later (``X-Broker-Scheduled-For``), list, read, cancel.

A scheduled message waits in ``broker_scheduledmessage``. The sweep (run every second by each
push dispatcher loop, and by the ``broker-maintenance`` schedule) locks the due rows with
``FOR UPDATE SKIP LOCKED``, publishes them through ``messages_publish`` with the same message id
and marks them DISPATCHED in the same transaction, so a message is published exactly once and a
cancel either wins before dispatch (204) or sees it dispatched (409); never both.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import datetime, timezone

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from broker.db.run import query_fetchone
from broker.errors import Conflict, InvalidInput, NotFound, PreconditionFailed
from broker.models import ScheduledMessage
from broker.tracing import trace_context_parse
from jobs.publish.auth import PublishContext
from jobs.publish.messages import NewMessage, message_id_generate, messages_publish
from jobs.publish.queries import Q

logger = logging.getLogger(__name__)
SCOPE = 3  # broker_counter scope of scheduled-message counts (owner = channel pk)
SCHEDULED = ScheduledMessage.Status.SCHEDULED.value
DISPATCHED = ScheduledMessage.Status.DISPATCHED.value
FAILED = ScheduledMessage.Status.FAILED.value


def scheduled_for_parse(raw: str) -> datetime:
    """An RFC 3339 date-time with a zone (``2030-01-02T03:04:05Z``, ``...+02:00``); else 400."""
    value = (raw or "").strip()
    try:
        if len(value) < 19 or value[10] not in "Tt ":
            raise ValueError(value)
        when = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "zZ" else value)
    except ValueError:
        raise InvalidInput("invalid_scheduled_for",
                           "X-Broker-Scheduled-For must be an RFC 3339 date-time with a time zone") from None
    if when.tzinfo is None:
        raise InvalidInput("invalid_scheduled_for", "X-Broker-Scheduled-For needs a time zone (e.g. Z)")
    try:  # in UTC: PostgreSQL refuses offsets beyond +-15:59 that Python accepts (was a 500)
        return when.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidInput("invalid_scheduled_for", "X-Broker-Scheduled-For is out of range") from None


def scheduled_message_create(*, ctx: PublishContext, message: NewMessage,
                             dispatch_at: datetime) -> str:
    """Store a message to publish at ``dispatch_at`` (at least BROKER_MIN_SCHEDULE_DELAY ahead by
    the database clock, else 412). 409 when the id is already used in the channel, by a
    message or another scheduled message. Returns the message id."""
    mid = message.message_id or message_id_generate()
    with connection.cursor() as cur:
        cur.execute(Q.scheduled_create.sql, {
            "at": dispatch_at, "min_delay": float(settings.BROKER_MIN_SCHEDULE_DELAY), "channel": ctx.channel_pk,
            "mid": mid, "producer": ctx.producer_pk, "payload": message.payload, "ctype": message.content_type,
            "prio": message.priority, "headers": Jsonb(message.headers or {}), "scheduled": SCHEDULED,
            "type": message.type, "ttl": message.ttl,
            "tp": message.trace.traceparent if message.trace else "",  # trace context: kept for the publish
            "ts": message.trace.tracestate if message.trace else "",
        })
        in_time, taken, created = cur.fetchone()
    if not in_time:
        raise PreconditionFailed("schedule_too_soon", f"X-Broker-Scheduled-For must be at least "
                                 f"{settings.BROKER_MIN_SCHEDULE_DELAY:g} seconds in the future")
    if taken or not created:
        raise Conflict("duplicate_message_id", "duplicate message id for channel")
    return mid


def _json(value) -> dict:
    """A jsonb column read through a raw cursor (Django leaves jsonb undecoded; JSONField decodes)."""
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def scheduled_dispatch_due(*, limit: int = 100) -> int:
    """Publish due scheduled messages (oldest due first) and mark them, atomically. Cheap when
    nothing is due (partial index on ``dispatch_at WHERE status = SCHEDULED``). Returns how many
    were published."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(Q.scheduled_due.sql, {"scheduled": SCHEDULED, "limit": limit})
        rows = cur.fetchall()
        if not rows:
            return 0
        groups = defaultdict(list)
        for row in rows:
            groups[(row[1], row[2], row[3], row[4])].append(row)
        ids, statuses, errors = [], [], []
        published = 0
        for (channel_pk, channel_id, producer_pk, producer_id), items in groups.items():
            ctx = PublishContext(channel_pk=channel_pk, channel_id=channel_id,
                                            producer_pk=producer_pk, producer_id=producer_id)
            messages = [NewMessage(payload=bytes(r[6]), content_type=r[7], priority=r[8],
                                              message_id=r[5], headers=_json(r[9]), type=r[10], ttl=r[11],
                                              trace=trace_context_parse(r[12], r[13]))
                        for r in items]
            results = messages_publish(ctx=ctx, messages=messages)
            for row, (_, created) in zip(items, results):
                ids.append(row[0])
                statuses.append(DISPATCHED if created else FAILED)
                errors.append("" if created else "a message with this id was published meanwhile")
                published += bool(created)
                if not created:
                    logger.warning("scheduled message %s/%s not published: id already used", channel_id, row[5])
        cur.execute(Q.scheduled_mark.sql, {"ids": ids, "statuses": statuses, "errors": errors, "scheduled": SCHEDULED})
    return published


def scheduled_message_cancel(*, channel_pk: int, message_id: str) -> None:
    """Delete a scheduled message that has not been dispatched yet: 404 unknown, 409 dispatched.
    A dispatch in progress holds the row lock, so the DELETE waits for it and then finds the
    row no longer SCHEDULED (409)."""
    with connection.cursor() as cur:
        cur.execute(Q.scheduled_cancel.sql, [channel_pk, message_id, SCHEDULED])
        if cur.fetchone() is not None:
            return
        cur.execute(Q.scheduled_status.sql, [channel_pk, message_id])
        row = cur.fetchone()
    if row is None:
        raise NotFound("scheduled_message_not_found", "scheduled message not found")
    raise Conflict("already_dispatched", "the scheduled message was already dispatched")


def scheduled_next_at(*, channel_pk: int):
    """Due time of the channel's next pending scheduled message (None when there is none)."""
    return query_fetchone(Q.scheduled_next, [channel_pk, SCHEDULED])[0]
