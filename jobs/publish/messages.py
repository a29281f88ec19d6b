"""Store a message and fan it out to one QUEUED job per consumer, atomically.

The message insert and the job fan-out are one SQL statement, hence one transaction: once the
producer gets 201 nothing can be lost. The wake-up of the consumers that got jobs is sent after the
commit (``jobs.publish.wakeup``: no NOTIFY in the durable transaction), so nobody is woken before
the rows are visible. This is a measured hot path (bench/publish.py), so it is raw SQL: one auth query and one
write statement per request, however many messages and consumers. The headers stored here are read
back by the claims (``headers_decode``)."""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from broker.db.run import query_fetchall
from broker.errors import Conflict, InvalidInput
from broker.models import Channel, Producer
from broker.tracing import TraceContext, span_start, trace_new
from broker.xid import xid_new
from jobs.advisories.record import ADVISORY_PRODUCER
from jobs.partitions.rows import partitions_for_publish
from jobs.partitions.settle import partition_settle
from jobs.publish.auth import PublishContext, producer_rate_take
from jobs.publish.queries import Q
from jobs.publish.wakeup import jobs_wake

logger = logging.getLogger("broker.advisories")  # advisory_publish: the name operators filter on
DISPATCHED = 102


def message_id_generate() -> str:
    """A new xid, as webhook-broker generates message ids (``broker.xid.xid_new``)."""
    return xid_new()


@dataclass
class NewMessage:
    payload: bytes
    content_type: str = "application/octet-stream"
    priority: int = 0
    message_id: str | None = None
    headers: dict = field(default_factory=dict)
    partition_key: str | None = None  # jobs.partitions: X-Broker-Partition-Key
    gate: int = 0  # X-Broker-Gate
    type: str | None = None  # filters: X-Broker-Message-Type (broker.message_types)
    ttl: int | None = None  # expiry: X-Broker-Message-TTL seconds (None: the channel's messageTTL)
    trace: TraceContext | None = None  # the producer's traceparent / tracestate (None: a new trace)


PARTITION_KEY_MAX = 255
GATE_MAX = 2**31 - 1


def partition_headers(headers) -> tuple[str | None, int]:
    """``X-Broker-Partition-Key`` (at most 255 characters) and ``X-Broker-Gate`` (an integer >= 0,
    default 0; only with a key) from request headers; 400 when invalid."""
    key = headers.get("X-Broker-Partition-Key")
    if key is not None:
        try:  # WSGI hands header bytes over as latin-1: a UTF-8 key is decoded back to its text
            key = key.encode("latin-1").decode("utf-8")
        except UnicodeError:
            pass
    return partition_parse(key, headers.get("X-Broker-Gate"))


def partition_parse(key: str | None, raw_gate: str | None) -> tuple[str | None, int]:
    """A partition key and gate (text) as given in headers or a batch item; 400 when invalid."""
    if key is not None and key.strip() == "":
        raise InvalidInput("invalid_partition_key", "X-Broker-Partition-Key must not be empty")
    if key is not None and len(key) > PARTITION_KEY_MAX:
        raise InvalidInput("invalid_partition_key", "X-Broker-Partition-Key is longer than 255 characters")
    gate = 0
    if raw_gate is not None and raw_gate.strip() != "":
        value = raw_gate.strip()
        if not (value.isascii() and value.isdigit()) or int(value) > GATE_MAX:
            raise InvalidInput("invalid_gate", "X-Broker-Gate must be an integer >= 0")
        gate = int(value)
        if key is None:
            raise InvalidInput("invalid_gate", "X-Broker-Gate needs X-Broker-Partition-Key")
    return key, gate


def _messages_insert(ctx: PublishContext, messages: list[NewMessage], ids: list[str],
                     traces: list[TraceContext]) -> list[tuple]:
    """The messages and their jobs in one statement (``insert_messages``): the stored ids."""
    return query_fetchall(Q.insert_messages, {
        "channel": ctx.channel_pk, "producer": ctx.producer_pk, "mids": ids,
        "payloads": [m.payload for m in messages], "ctypes": [m.content_type for m in messages],
        "prios": [m.priority for m in messages], "headers": [Jsonb(m.headers or {}) for m in messages],
        "types": [m.type for m in messages], "ttls": [m.ttl for m in messages],
        "pkeys": [m.partition_key for m in messages], "gates": [int(m.gate) for m in messages],
        "tps": [t.traceparent for t in traces], "tss": [t.tracestate for t in traces],
    }, prepare=True)  # prepared: planning this multi-CTE statement costs more than running it


def _publish_partitioned(ctx: PublishContext, messages: list[NewMessage], ids: list[str],
                         traces: list[TraceContext]) -> list[tuple]:
    """A publish with partition keys, in one transaction: partitions upserted and checked first
    (409 ``partition_closed`` / ``gate_passed`` roll everything back), then messages and jobs in
    one statement, then the partitions whose gate is below a new job's are settled (they may have
    been waiting with nothing left at their gate)."""
    gates: dict[str, list[int]] = {}
    for m in messages:
        if m.partition_key is not None:
            gates.setdefault(m.partition_key, []).append(int(m.gate))
    with transaction.atomic():
        settle = partitions_for_publish(channel_pk=ctx.channel_pk, gates_by_key=gates)
        rows = _messages_insert(ctx, messages, ids, traces)
        for pk in settle:
            partition_settle(partition_pk=pk)
    return rows


def messages_publish(*, ctx: PublishContext, messages: list[NewMessage]) -> list[tuple[str, bool]]:
    """Store messages and their jobs in one statement (so one transaction, one round trip).

    Returns [(message_id, created)] in input order; ``created`` is False for a duplicate id (an id
    already in the channel, or repeated within the batch: the first occurrence wins).
    """
    if ctx.rate:
        producer_rate_take(ctx=ctx, n=len(messages))
    ids = [m.message_id or message_id_generate() for m in messages]
    spans = [span_start(f"publish {ctx.channel_id}", parent=m.trace, kind="producer", attributes={
        "messaging.system": "broker", "messaging.operation.type": "send", "messaging.destination.name": ctx.channel_id,
        "messaging.message.id": mid, "broker.message.type": m.type}) for m, mid in zip(messages, ids)]
    traces = [message_trace(m, span) for m, span in zip(messages, spans)]
    if any(m.partition_key is not None for m in messages):
        rows = _publish_partitioned(ctx, messages, ids, traces)
    elif len(messages) == 1:  # the common single publish: scalar parameters, a cheaper statement
        m = messages[0]
        rows = query_fetchall(Q.insert_one, {
            "channel": ctx.channel_pk, "producer": ctx.producer_pk, "mid": ids[0], "payload": m.payload,
            "ctype": m.content_type, "prio": m.priority, "headers": Jsonb(m.headers or {}),
            "type": m.type, "ttl": m.ttl, "tp": traces[0].traceparent, "ts": traces[0].tracestate,
        }, prepare=True)
    else:
        rows = _messages_insert(ctx, messages, ids, traces)
    if rows:
        jobs_wake(consumer_ids=rows[0][1])  # (every row carries the statement's consumers)
    created = {r[0] for r in rows}
    result = []
    for mid in ids:
        if mid in created:
            result.append((mid, True))
            created.discard(mid)  # a repeat of the same id later in the batch is a duplicate
        else:
            result.append((mid, False))
    for span, (_mid, fresh) in zip(spans, result):
        if span is not None:
            span.end(**{"broker.duplicate": not fresh})
    return result


def message_trace(message: NewMessage, span) -> TraceContext:
    """The trace context stored with a message: its publish span's when OpenTelemetry records one
    (the producer's span its parent), else the producer's own, else a new trace."""
    if span is not None:
        return TraceContext(span.traceparent, message.trace.tracestate if message.trace else "")
    return message.trace or trace_new()


def message_publish(*, ctx: PublishContext, message: NewMessage) -> str:
    """Publish one message; 409 when its id already exists in the channel."""
    [(mid, created)] = messages_publish(ctx=ctx, messages=[message])
    if not created:
        raise Conflict("duplicate_message_id", "duplicate message id for channel")
    return mid


def advisory_publish(sender=None, body: dict | None = None, **kwargs) -> None:
    """Receiver of ``jobs.advisories.advisory_recorded``: the advisory as a message of
    BROKER_ADVISORY_CHANNEL, from the broker-owned producer (created on first use)."""
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


def headers_decode(value) -> dict:
    """A message's headers as a dict: jsonb comes back as text through Django's connection (its
    JSONField decodes itself); anything but a JSON object reads as no headers."""
    if isinstance(value, (str, bytes)):
        value = json.loads(value) if value and value != "{}" else {}
    return value if isinstance(value, dict) else {}
