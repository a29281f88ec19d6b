"""Advisories: broker events about consumers, recorded and optionally published to a channel.

``advisory_record`` is the one entry point (pinned / unpinned priority groups today; partition
events reuse it). The record is written in the caller's transaction; when
``BROKER_ADVISORY_CHANNEL`` names a channel the same JSON is published there, in the same
transaction, through ``jobs.publishing.messages_publish`` (so subscribers of that
channel get it like any message, and a record is never lost to a failed publish: publishing
problems are logged, never raised). The publisher is a broker-owned producer, ``broker-advisories``,
created on first use with a random token nobody needs.
"""

from __future__ import annotations

import json
import logging
import secrets

from django.conf import settings
from django.db import connection, transaction

from broker.models import Channel, Producer
from consumers.models import Advisory
from jobs.publishing import NewMessage, PublishContext, messages_publish
from jobs.queries import Q

logger = logging.getLogger("broker.advisories")

ADVISORY_PRODUCER = "broker-advisories"


def advisory_repr(advisory: Advisory) -> dict:
    """The JSON shape shared by the advisories endpoint and the published message."""
    body = {"type": advisory.type, "channel": advisory.channel_id, "consumer": advisory.consumer_id,
            "group": advisory.group, **advisory.data}
    body["timestamp"] = advisory.created_at.isoformat().replace("+00:00", "Z")
    return body


def _publish(body: dict) -> None:
    target = settings.BROKER_ADVISORY_CHANNEL
    channel = Channel.objects.filter(channel_id=target).only("pk").first()
    if channel is None:
        logger.warning("BROKER_ADVISORY_CHANNEL %r does not exist; advisory %s only recorded", target, body["type"])
        return
    producer = Producer.objects.filter(producer_id=ADVISORY_PRODUCER).only("pk").first()
    if producer is None:
        with connection.cursor() as cur:  # concurrent first uses: one insert wins, the others read it
            cur.execute(
                Q.advisory_producer_create.sql,
                [ADVISORY_PRODUCER, "Broker advisories", secrets.token_urlsafe(32)])
        producer = Producer.objects.only("pk").get(producer_id=ADVISORY_PRODUCER)
    ctx = PublishContext(channel_pk=channel.pk, channel_id=target, producer_pk=producer.pk,
                         producer_id=ADVISORY_PRODUCER)
    messages_publish(ctx=ctx, messages=[NewMessage(payload=json.dumps(body).encode(),
                                                   content_type="application/json")])


def advisory_record(*, type: str, channel: str, consumer: str = "", consumer_pk: int | None = None,
                    group: str = "", data: dict | None = None) -> Advisory:
    """Record an advisory and, when ``BROKER_ADVISORY_CHANNEL`` is set, publish it there (same
    transaction; a failing publish is logged and rolled back to a savepoint, the record stays)."""
    with connection.cursor() as cur:
        cur.execute(
            Q.advisory_insert.sql,
            [type, channel, consumer, consumer_pk, group, json.dumps(data or {})])
        pk, created_at = cur.fetchone()
    advisory = Advisory(pk=pk, type=type, channel_id=channel, consumer_id=consumer, consumer_pk=consumer_pk,
                        group=group, data=data or {}, created_at=created_at)
    if settings.BROKER_ADVISORY_CHANNEL:
        try:
            with transaction.atomic():
                _publish(advisory_repr(advisory))
        except Exception:  # noqa: BLE001 - the record must survive any publishing problem
            logger.exception("publishing advisory %s to %s failed", type, settings.BROKER_ADVISORY_CHANNEL)
    return advisory


def advisories_list(*, consumer_pk: int, limit: int = 100) -> list[dict]:
    """A consumer's most recent advisories, oldest first."""
    rows = list(Advisory.objects.filter(consumer_pk=consumer_pk).order_by("-id")[:limit])
    return [advisory_repr(a) for a in reversed(rows)]
