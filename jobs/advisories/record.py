"""Advisories: broker events about consumers, recorded and optionally published to a channel.

``advisory_record`` is the one entry point (pinned / unpinned priority groups today; partition
events reuse it). The record is written in the caller's transaction; when
``BROKER_ADVISORY_CHANNEL`` names a channel the same JSON is published there, in the same
transaction, by the receiver of the ``advisory_recorded`` signal (``jobs.publish.messages.advisory_publish``,
connected in ``jobs.apps``: publishing imports partitions, which record advisories, so this module
cannot import publishing) (so subscribers of that
channel get it like any message, and a record is never lost to a failed publish: publishing
problems are logged, never raised). The publisher is a broker-owned producer, ``broker-advisories``,
created on first use with a random token nobody needs.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import Signal

from consumers.models import Advisory
from jobs.advisories.queries import Q

logger = logging.getLogger("broker.advisories")
ADVISORY_PRODUCER = "broker-advisories"
# Sent with ``body`` (advisory_repr) when BROKER_ADVISORY_CHANNEL is set, inside a savepoint.
advisory_recorded = Signal()


def advisory_repr(advisory: Advisory) -> dict:
    """The JSON shape shared by the advisories endpoint and the published message."""
    body = {"type": advisory.type, "channel": advisory.channel_id, "consumer": advisory.consumer_id,
            "group": advisory.group, **advisory.data}
    body["timestamp"] = advisory.created_at.isoformat().replace("+00:00", "Z")
    return body


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
                advisory_recorded.send(sender=Advisory, body=advisory_repr(advisory))
        except Exception:  # noqa: BLE001 - the record must survive any publishing problem
            logger.exception("publishing advisory %s to %s failed", type, settings.BROKER_ADVISORY_CHANNEL)
    return advisory


def advisories_list(*, consumer_pk: int, limit: int = 100) -> list[dict]:
    """A consumer's most recent advisories, oldest first."""
    rows = list(Advisory.objects.filter(consumer_pk=consumer_pk).order_by("-id")[:limit])
    return [advisory_repr(a) for a in reversed(rows)]
