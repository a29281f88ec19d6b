"""HTTP API for publishing: one message (``broadcast``, or scheduled for later) and its headers;
the batch body parser (the batch endpoint shares its path with the message list, web.api.messages).

``broadcast_post`` is the handler; ``BroadcastView`` documents it and serves what the fast lane
(``web.api.fast_lane``) and the web server's native route (``web.server.native``, which parses with
``broadcast_message`` too) leave to the full stack. It reads headers from ``request.META`` (what
``request.headers`` is built from, without building it)."""

from __future__ import annotations

import json
from urllib.parse import quote

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.views import APIView

from broker.errors import DomainError, InvalidInput, TooLarge
from broker.message_types import message_type_parse, ttl_parse
from broker.numbers import whole
from broker.tracing import trace_context_parse
from eventtypes.validation import message_validate
from jobs.publish.auth import PublishContext, publish_authenticate
from jobs.publish.grouped import message_publish_grouped
from jobs.publish.messages import NewMessage, partition_headers, partition_parse
from jobs.publish.scheduled import scheduled_for_parse, scheduled_message_create
from web.api.common import CHANNEL_TOKEN, ERROR, read_body
from web.api.publish_schemas import GATE, INT32, MESSAGE_ID, MESSAGE_TYPE, PARTITION_KEY, PAYLOAD, TTL, publish_request
from web.api.representations import message_url

PUBLISH_PARAMS = [
    CHANNEL_TOKEN,
    OpenApiParameter("X-Broker-Producer-ID", OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter("X-Broker-Producer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER),
]


FILTER_EXPIRY_PARAMS = [
    OpenApiParameter("X-Broker-Message-Type", MESSAGE_TYPE, OpenApiParameter.HEADER,
                     description="the message's type (<= 128 chars of A-Z a-z 0-9 . _ : / -): only consumers whose "
                                 "messageTypes match get a job"),
    OpenApiParameter("X-Broker-Message-TTL", TTL, OpenApiParameter.HEADER,
                     description="seconds (1..31536000) the message stays deliverable; default the channel's "
                                 "messageTTL; then its jobs become DEAD with reason expired"),
]


TRACE_PARAMS = [
    OpenApiParameter("traceparent", OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description="W3C trace context (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>): stored "
                                 "with the message, every delivery continues its trace; absent or invalid: a new trace"),
    OpenApiParameter("tracestate", OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description="W3C tracestate, kept with a valid traceparent (at most 32 members, 512 characters)"),
]


PARTITION_PARAMS = [
    OpenApiParameter("X-Broker-Partition-Key", PARTITION_KEY, OpenApiParameter.HEADER,
                     description="partition of the message's jobs (<= 255 chars); 409 partition_closed"),
    OpenApiParameter("X-Broker-Gate", GATE, OpenApiParameter.HEADER,
                     description="gate in the partition (>= 0, default 0; only with X-Broker-Partition-Key, "
                                 "else 400 invalid_gate); 409 gate_passed when below the partition's current gate"),
]


def parse_priority(raw: str | None) -> int:
    if raw is None or raw.strip() == "":
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidInput("invalid_priority", "X-Broker-Message-Priority must be an integer") from None
    if not -(2**31) <= value < 2**31:
        raise InvalidInput("invalid_priority", "X-Broker-Message-Priority is out of range")
    return value


def parse_message_id(raw: str | None) -> str | None:
    if raw is None:
        return None
    value = raw.strip()
    if not value:
        return None
    if len(value) > 255:
        raise InvalidInput("invalid_message_id", "X-Broker-Message-ID is longer than 255 characters")
    return value


def metadata_headers(request) -> dict:
    """Headers named in X-Broker-Metadata-Headers (comma-separated) that are present, looked up in
    ``request.META`` as ``request.headers`` would find them (without building it: a hot path)."""
    names = request.META.get("HTTP_X_BROKER_METADATA_HEADERS")
    if not names:
        return {}
    meta = request.META
    result = {}
    for name in names.split(","):
        name = name.strip()
        if not name or "_" in name:  # (HttpHeaders has no name with "_": META cannot tell it from "-")
            continue
        if not name.isascii():  # (case rules beyond ASCII: as HttpHeaders finds it)
            if name in request.headers:
                result[name] = request.headers[name]
            continue
        key = name.upper().replace("-", "_")
        value = meta.get(key if key in _UNPREFIXED else "HTTP_" + key)
        if value is not None:
            result[name] = value
    return result


_UNPREFIXED = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})  # HttpHeaders.UNPREFIXED_HEADERS


def publish_context(request, channel_id: str) -> PublishContext:
    meta = request.META
    return publish_authenticate(
        channel_id=channel_id,
        channel_token=meta.get("HTTP_X_BROKER_CHANNEL_TOKEN"),
        producer_id=meta.get("HTTP_X_BROKER_PRODUCER_ID"),
        producer_token=meta.get("HTTP_X_BROKER_PRODUCER_TOKEN"),
    )


def broadcast_post(request, channel_id: str) -> HttpResponse:
    """Publish one message (or schedule it): 201 with the Location of the message. A plain publish
    shares the transaction of the publishes arriving with it (``message_publish_grouped``)."""
    meta = request.META
    credentials = {"channel_id": channel_id, "channel_token": meta.get("HTTP_X_BROKER_CHANNEL_TOKEN"),
                   "producer_id": meta.get("HTTP_X_BROKER_PRODUCER_ID"),
                   "producer_token": meta.get("HTTP_X_BROKER_PRODUCER_TOKEN")}
    try:  # a large body is read only once the credentials passed (read_body)
        message, scheduled_for = broadcast_message(request, credentials_check=lambda: publish_authenticate(**credentials))
        broadcast_event_check(channel_id, message)
    except DomainError:
        publish_authenticate(**credentials)  # refusals of the credentials come first
        raise
    response = HttpResponse(status=201)
    del response["Content-Type"]  # an empty body, as DRF answered it
    if scheduled_for:  # publish later (jobs.publish.scheduled): 400 bad date, 412 too soon
        mid = scheduled_message_create(ctx=publish_authenticate(**credentials), message=message,
                                       dispatch_at=scheduled_for_parse(scheduled_for))
        response["Location"] = f"/channel/{channel_id}/scheduled-message/{quote(mid, safe='-_.~')}"
    else:
        mid = message_publish_grouped(**credentials, message=message)
        response["Location"] = message_url(channel_id, quote(mid, safe="-_.~"))
    return response


def broadcast_event_check(channel_id: str, message: NewMessage, *, rules=None) -> None:
    """Event types (issue 37): 422 when the message breaks its channel's event types, before any
    transaction; a scheduled message is checked now, when it is created (not again when due).
    ``rules``: the channel's as held (``channel_rules_held``), else read as needed."""
    message_validate(channel_id=channel_id, message_type=message.type, payload=message.payload,
                     content_type=message.content_type, rules=rules)


def broadcast_message(request, *, credentials_check=None) -> tuple[NewMessage, str]:
    """The message of a broadcast request and its X-Broker-Scheduled-For (empty: now); 400 / 413
    refusals. A body larger than ``BODY_PREREAD`` is read only after ``credentials_check`` passed."""
    meta = request.META
    body = read_body(request, settings.BROKER_MAX_PAYLOAD_BYTES, credentials_check=credentials_check)
    if not body:
        raise InvalidInput("empty_body", "message body must not be empty")
    partitioned = "HTTP_X_BROKER_PARTITION_KEY" in meta or "HTTP_X_BROKER_GATE" in meta
    partition_key, gate = partition_headers(request.headers) if partitioned else (None, 0)
    message = NewMessage(
        payload=body,
        content_type=meta.get("CONTENT_TYPE") or "application/octet-stream",
        priority=parse_priority(meta.get("HTTP_X_BROKER_MESSAGE_PRIORITY")),
        message_id=parse_message_id(meta.get("HTTP_X_BROKER_MESSAGE_ID")),
        headers=metadata_headers(request),
        partition_key=partition_key, gate=gate,
        type=message_type_parse(meta.get("HTTP_X_BROKER_MESSAGE_TYPE")),
        ttl=ttl_parse(meta.get("HTTP_X_BROKER_MESSAGE_TTL")),
        trace=trace_context_parse(meta.get("HTTP_TRACEPARENT"), meta.get("HTTP_TRACESTATE")),
    )
    scheduled_for = (meta.get("HTTP_X_BROKER_SCHEDULED_FOR") or "").strip()
    if scheduled_for and partition_key is not None:
        raise InvalidInput("partition_not_schedulable", "a scheduled message cannot carry X-Broker-Partition-Key")
    return message, scheduled_for


class BroadcastView(APIView):
    parser_classes = []  # the body is stored raw, whatever its content type
    authentication_classes = []  # channel and producer tokens (broadcast_post); no session is read

    @extend_schema(
        summary="Publish a message",
        description="The body is stored as-is with its Content-Type. 201 with Location of the message. When the "
                    "channel has an event type for X-Broker-Message-Type with a schema, the payload must be JSON "
                    "that validates (422 schema_validation_failed with detail and path, a JSON pointer); on a "
                    "closed channel a type without an event type is 422 unknown_event_type.",
        parameters=[
            *PUBLISH_PARAMS,
            OpenApiParameter("X-Broker-Message-ID", MESSAGE_ID, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Message-Priority", INT32, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Metadata-Headers", OpenApiTypes.STR, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Scheduled-For", OpenApiTypes.DATETIME, OpenApiParameter.HEADER,
                             description="RFC 3339; publish then instead of now (201 with the "
                                         "scheduled-message Location; 400 bad date, 412 too soon); not with "
                                         "X-Broker-Partition-Key (400 partition_not_schedulable)"),
            *PARTITION_PARAMS,
            *FILTER_EXPIRY_PARAMS,
            *TRACE_PARAMS,
        ],
        request=publish_request(PAYLOAD),
        responses={201: OpenApiResponse(description="Created; Location header"), 400: ERROR, 401: ERROR,
                   403: ERROR, 404: ERROR, 409: ERROR, 412: ERROR, 413: ERROR, 422: ERROR, 429: ERROR},
    )
    def post(self, request, channel_id: str):
        return broadcast_post(request, channel_id)


def batch_parse(raw: bytes) -> list[NewMessage]:
    try:
        items = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidInput("malformed_json", "body must be a JSON list of messages") from None
    if isinstance(items, dict) and isinstance(items.get("Messages"), list):
        items = items["Messages"]
    if not isinstance(items, list) or not items:
        raise InvalidInput("invalid_batch", "body must be a non-empty JSON list of messages")
    if len(items) > settings.BROKER_MAX_BATCH_MESSAGES:
        raise TooLarge("batch_too_large", f"at most {settings.BROKER_MAX_BATCH_MESSAGES} messages per batch")
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "Payload" not in item:
            raise InvalidInput("invalid_batch", f"message {i} must be an object with a Payload")
        payload = item["Payload"]
        content_type = item.get("ContentType")
        if isinstance(payload, str):
            data = payload.encode("utf-8", "surrogatepass")
        else:
            data = json.dumps(payload, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        if not data or payload is None:
            raise InvalidInput("empty_body", f"message {i} has an empty Payload")
        if len(data) > settings.BROKER_MAX_PAYLOAD_BYTES:
            raise TooLarge("payload_too_large", f"message {i} is larger than {settings.BROKER_MAX_PAYLOAD_BYTES} bytes")
        if content_type is not None and not isinstance(content_type, str):
            raise InvalidInput("invalid_batch", f"message {i}: ContentType must be a string")
        priority = whole(item.get("Priority", 0))  # 2.0 is an integer (JSON Schema 2020-12, OpenAPI 3.1)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise InvalidInput("invalid_priority", f"message {i}: Priority must be an integer")
        mid = item.get("MessageID")
        if mid is not None and not isinstance(mid, str):
            raise InvalidInput("invalid_message_id", f"message {i}: MessageID must be a string")
        key, gate = item.get("PartitionKey"), whole(item.get("Gate"))  # partitions, per message
        if key is not None or gate is not None:
            key, gate = partition_parse(
                key if isinstance(key, str) or key is None else "",
                None if gate is None else (str(gate) if isinstance(gate, int) and not isinstance(gate, bool) else "x"))
        messages.append(NewMessage(
            payload=data, content_type=content_type or "application/octet-stream", priority=priority,
            message_id=parse_message_id(mid), partition_key=key, gate=gate or 0,
            type=message_type_parse(item.get("Type"), field=f"message {i}: Type"),
            ttl=ttl_parse(item.get("TTL"), field=f"message {i}: TTL"),
            trace=trace_context_parse(item.get("traceparent", item.get("TraceParent")),  # invalid: a new trace
                                      item.get("tracestate", item.get("TraceState"))),
        ))
    return messages
