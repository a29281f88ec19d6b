"""HTTP API for producers, channels, publishing and messages (webhook-broker compatible).

Views translate HTTP to service calls and back; they hold no business logic.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from django.conf import settings
from django.db import connection
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.counters import JOB, MESSAGE, counts_for
from broker.errors import Forbidden, InvalidInput, NotFound, TooLarge, Unauthenticated
from broker.models import Channel, Message, Producer, ScheduledMessage, SeedState
from broker.services import publishing
from broker.services.registry import Precondition, channel_upsert, producer_upsert
from broker.services.seed import seed_applied
from broker.tokens import tokens_equal
from broker.xid import job_xid
from web.api.errors import ERROR_RESPONSE
from web.api.pagination import paginate
from web.api.representations import (
    channel_repr, last_modified, message_url, producer_repr, rfc3339,
)
from web.auth import ADMIN_HEADER, is_admin, require_registry

ERROR = ERROR_RESPONSE  # the JSON error body (component "Error")
ADMIN_PARAM = OpenApiParameter(ADMIN_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
                               description="BROKER_ADMIN_TOKEN (or a staff session)")
CHANNEL_TOKEN = OpenApiParameter("X-Broker-Channel-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
PRECONDITION = OpenApiParameter("If-Unmodified-Since", OpenApiTypes.STR, OpenApiParameter.HEADER,
                                description="required for an update: the object's Last-Modified")
PAGE_PARAMS = [OpenApiParameter("next", OpenApiTypes.STR), OpenApiParameter("previous", OpenApiTypes.STR)]
LIST = OpenApiResponse(OpenApiTypes.OBJECT, description='{"Result": [relative URLs], "Pages": {"next", "previous"}}')
OBJ = OpenApiResponse(OpenApiTypes.OBJECT)


def form_value(request, name: str) -> str | None:
    """A form/JSON field as a string (None when absent). Non-scalar JSON values are a 400."""
    data = request.data
    if not hasattr(data, "get"):
        raise InvalidInput("malformed_request", "body must be form fields or a JSON object")
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise InvalidInput("invalid_field", f"{name} must be a string")
    return str(value)


def with_last_modified(body: dict, obj, status: int = 200) -> Response:
    response = Response(body, status=status)
    response["Last-Modified"] = last_modified(obj.updated_at)
    return response


def channel_or_404(channel_id: str) -> Channel:
    channel = Channel.objects.filter(channel_id=channel_id).first()
    if channel is None:
        raise NotFound("channel_not_found", "channel not found")
    return channel


def require_channel_reader(request, channel: Channel) -> None:
    """Reading messages needs the channel token or the admin token."""
    if is_admin(request):
        return
    given = request.headers.get("X-Broker-Channel-Token")
    if given is None:
        raise Unauthenticated("unauthorized", "X-Broker-Channel-Token or X-Broker-Admin-Token is required")
    if not tokens_equal(given, channel.token):
        raise Forbidden("forbidden", "channel token does not match")


# --- producers ------------------------------------------------------------------------------------

class ProducerListView(APIView):
    @extend_schema(summary="List producers", parameters=[ADMIN_PARAM, *PAGE_PARAMS], responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR})
    def get(self, request):
        require_registry(request)
        return Response(paginate(request, Producer.objects.all(), path="/producers",
                                 item=lambda p: f"/producer/{p.producer_id}"))


class ProducerView(APIView):
    @extend_schema(summary="Get a producer", parameters=[ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, producer_id: str):
        require_registry(request)
        producer = Producer.objects.filter(producer_id=producer_id).first()
        if producer is None:
            raise NotFound("producer_not_found", "producer not found")
        return with_last_modified(producer_repr(producer), producer)

    @extend_schema(
        summary="Create or update a producer",
        description="Form fields (or JSON): token, name, rateLimitPerSecond (messages per second, empty or 0: "
                    "no limit), burst (bucket size, default max(1, rateLimitPerSecond)). Update needs "
                    "If-Unmodified-Since.",
        parameters=[ADMIN_PARAM, PRECONDITION], request=OpenApiTypes.OBJECT,
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 412: ERROR, 415: ERROR},
    )
    def put(self, request, producer_id: str):
        require_registry(request)
        producer, _created = producer_upsert(
            producer_id=producer_id, name=form_value(request, "name"), token=form_value(request, "token"),
            precondition=Precondition(request.headers.get("If-Unmodified-Since")),
            rate=producer_rate_parse(request),
        )
        return with_last_modified(producer_repr(producer), producer)  # 200 on create too, as webhook-broker


def producer_rate_parse(request) -> dict:
    """Flow control fields of the producer PUT: rateLimitPerSecond (0 clears it) and burst."""
    fields: dict = {}
    raw = form_value(request, "rateLimitPerSecond")
    if raw is not None and raw.strip() != "":
        try:
            rate = float(raw)
        except ValueError:
            raise InvalidInput("invalid_rateLimitPerSecond", "rateLimitPerSecond must be a number") from None
        if not 0 <= rate < 1e9:
            raise InvalidInput("invalid_rateLimitPerSecond", "rateLimitPerSecond is out of range")
        fields["rate_limit_per_second"] = rate or None
    raw = form_value(request, "burst")
    if raw is not None and raw.strip() != "":
        try:
            burst = int(raw)
        except ValueError:
            raise InvalidInput("invalid_burst", "burst must be an integer") from None
        if not 1 <= burst <= 2**31 - 1:
            raise InvalidInput("invalid_burst", "burst is out of range")
        fields["burst"] = burst
    return fields


# --- channels -------------------------------------------------------------------------------------

class ChannelListView(APIView):
    @extend_schema(summary="List channels", parameters=[ADMIN_PARAM, *PAGE_PARAMS], responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR})
    def get(self, request):
        require_registry(request)
        return Response(paginate(request, Channel.objects.all(), path="/channels",
                                 item=lambda c: f"/channel/{c.channel_id}"))


class ChannelView(APIView):
    @extend_schema(summary="Get a channel", parameters=[ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        return with_last_modified(channel_repr(channel), channel)

    @extend_schema(
        summary="Create or update a channel",
        description="Form fields (or JSON): token, name. Update needs If-Unmodified-Since.",
        parameters=[ADMIN_PARAM, PRECONDITION], request=OpenApiTypes.OBJECT,
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 412: ERROR, 415: ERROR},
    )
    def put(self, request, channel_id: str):
        require_registry(request)
        channel, _created = channel_upsert(
            channel_id=channel_id, name=form_value(request, "name"), token=form_value(request, "token"),
            precondition=Precondition(request.headers.get("If-Unmodified-Since")),
        )
        return with_last_modified(channel_repr(channel), channel)  # 200 on create too, as webhook-broker


# --- publishing -----------------------------------------------------------------------------------

PUBLISH_PARAMS = [
    CHANNEL_TOKEN,
    OpenApiParameter("X-Broker-Producer-ID", OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter("X-Broker-Producer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER),
]


PARTITION_PARAMS = [
    OpenApiParameter("X-Broker-Partition-Key", OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description="partition of the message's jobs (<= 255 chars); 409 partition_closed"),
    OpenApiParameter("X-Broker-Gate", OpenApiTypes.INT, OpenApiParameter.HEADER,
                     description="gate in the partition (>= 0, default 0); 409 gate_passed when below the "
                                 "partition's current gate"),
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
    """Headers named in X-Broker-Metadata-Headers (comma-separated) that are present."""
    names = request.headers.get("X-Broker-Metadata-Headers", "")
    result = {}
    for name in names.split(","):
        name = name.strip()
        if name and name in request.headers:
            result[name] = request.headers[name]
    return result


def publish_context(request, channel_id: str) -> publishing.PublishContext:
    return publishing.publish_authenticate(
        channel_id=channel_id,
        channel_token=request.headers.get("X-Broker-Channel-Token"),
        producer_id=request.headers.get("X-Broker-Producer-ID"),
        producer_token=request.headers.get("X-Broker-Producer-Token"),
    )


def read_body(request, limit: int) -> bytes:
    """The raw body, refusing (413) before reading when Content-Length says it is too large."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InvalidInput("malformed_request", "invalid Content-Length") from None
    if declared > limit:
        raise TooLarge("payload_too_large", f"body is larger than {limit} bytes")
    body = request.body
    if len(body) > limit:
        raise TooLarge("payload_too_large", f"body is larger than {limit} bytes")
    return body


class BroadcastView(APIView):
    parser_classes = []  # the body is stored raw, whatever its content type

    @extend_schema(
        summary="Publish a message",
        description="The body is stored as-is with its Content-Type. 201 with Location of the message.",
        parameters=[
            *PUBLISH_PARAMS,
            OpenApiParameter("X-Broker-Message-ID", OpenApiTypes.STR, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Message-Priority", OpenApiTypes.INT, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Metadata-Headers", OpenApiTypes.STR, OpenApiParameter.HEADER),
            OpenApiParameter("X-Broker-Scheduled-For", OpenApiTypes.DATETIME, OpenApiParameter.HEADER,
                             description="RFC 3339; publish then instead of now (201 with the "
                                         "scheduled-message Location; 400 bad date, 412 too soon)"),
            *PARTITION_PARAMS,
        ],
        request={"*/*": OpenApiTypes.BINARY},
        responses={201: OpenApiResponse(description="Created; Location header"), 400: ERROR, 401: ERROR,
                   403: ERROR, 404: ERROR, 409: ERROR, 412: ERROR, 413: ERROR, 429: ERROR},
    )
    def post(self, request, channel_id: str):
        ctx = publish_context(request, channel_id)
        body = read_body(request, settings.BROKER_MAX_PAYLOAD_BYTES)
        if not body:
            raise InvalidInput("empty_body", "message body must not be empty")
        partition_key, gate = publishing.partition_headers(request.headers)
        message = publishing.NewMessage(
            payload=body,
            content_type=request.META.get("CONTENT_TYPE") or "application/octet-stream",
            priority=parse_priority(request.headers.get("X-Broker-Message-Priority")),
            message_id=parse_message_id(request.headers.get("X-Broker-Message-ID")),
            headers=metadata_headers(request),
            partition_key=partition_key, gate=gate,
        )
        scheduled_for = (request.headers.get("X-Broker-Scheduled-For") or "").strip()
        if scheduled_for and partition_key is not None:
            raise InvalidInput("partition_not_schedulable", "a scheduled message cannot carry X-Broker-Partition-Key")
        if scheduled_for:  # publish later (jobs.scheduling): 400 bad date, 412 too soon
            from jobs.scheduling import scheduled_for_parse, scheduled_message_create

            mid = scheduled_message_create(ctx=ctx, message=message, dispatch_at=scheduled_for_parse(scheduled_for))
            response = Response(status=201)
            response["Location"] = f"/channel/{channel_id}/scheduled-message/{quote(mid, safe='-_.~')}"
            return response
        mid = publishing.message_publish(ctx=ctx, message=message)
        response = Response(status=201)
        response["Location"] = message_url(channel_id, quote(mid, safe="-_.~"))
        return response


def batch_parse(raw: bytes) -> list[publishing.NewMessage]:
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
        priority = item.get("Priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise InvalidInput("invalid_priority", f"message {i}: Priority must be an integer")
        mid = item.get("MessageID")
        if mid is not None and not isinstance(mid, str):
            raise InvalidInput("invalid_message_id", f"message {i}: MessageID must be a string")
        key, gate = item.get("PartitionKey"), item.get("Gate")  # partitions, per message
        if key is not None or gate is not None:
            key, gate = publishing.partition_parse(
                key if isinstance(key, str) or key is None else "",
                None if gate is None else (str(gate) if isinstance(gate, int) and not isinstance(gate, bool) else "x"))
        messages.append(publishing.NewMessage(
            payload=data, content_type=content_type or "application/octet-stream", priority=priority,
            message_id=parse_message_id(mid), partition_key=key, gate=gate or 0,
        ))
    return messages


class MessagesView(APIView):
    parser_classes = []

    @extend_schema(
        summary="List messages of a channel",
        parameters=[CHANNEL_TOKEN, ADMIN_PARAM, OpenApiParameter("status", OpenApiTypes.STR), *PAGE_PARAMS],
        responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def get(self, request, channel_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        qs = Message.objects.filter(channel=channel).only("id", "message_id")
        statuses = []
        for raw in request.query_params.getlist("status"):
            for part in raw.split(","):
                part = part.strip().upper()
                if not part:
                    continue
                if part.isdigit() and int(part) in Message.Status.values:
                    statuses.append(int(part))
                elif part in Message.Status.names:
                    statuses.append(Message.Status[part].value)
                else:
                    raise InvalidInput("invalid_status", "status must be ACKNOWLEDGED/DISPATCHED (or 101/102)")
        if statuses:
            qs = qs.filter(status__in=statuses)
        return Response(paginate(request, qs, path=f"/channel/{channel_id}/messages", keep_params=("status",),
                                 item=lambda m: message_url(channel_id, quote(m.message_id, safe="-_.~"))))

    @extend_schema(
        summary="Publish a batch of up to 1,000 messages in one transaction",
        description='JSON list of {"MessageID"?, "Priority"?, "ContentType"?, "PartitionKey"?, "Gate"?, "Payload"}. '
                    "Answers per message: created or duplicate. 201 when at least one was created.",
        parameters=[*PUBLISH_PARAMS, *PARTITION_PARAMS], request={"application/json": OpenApiTypes.OBJECT},
        responses={200: OBJ, 201: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 413: ERROR,
                   429: ERROR},
    )
    def post(self, request, channel_id: str):
        ctx = publish_context(request, channel_id)
        limit = settings.BROKER_MAX_PAYLOAD_BYTES * 4 + settings.BROKER_MAX_BATCH_MESSAGES * 1024
        partition_key, gate = publishing.partition_headers(request.headers)
        messages = batch_parse(read_body(request, max(limit, 64 * 1024 * 1024)))
        for m in messages:  # partitions: the request's headers apply to every message of the batch
            if m.partition_key is None and partition_key is not None:
                m.partition_key, m.gate = partition_key, gate
        results = publishing.messages_publish(ctx=ctx, messages=messages)
        created = sum(1 for _, ok in results if ok)
        body = {
            "Created": created,
            "Duplicates": len(results) - created,
            "Result": [
                {"MessageID": mid, "Status": "created" if ok else "duplicate",
                 "Location": message_url(channel_id, quote(mid, safe="-_.~"))}
                for mid, ok in results
            ],
        }
        return Response(body, status=201 if created else 200)


class MessageView(APIView):
    @extend_schema(summary="Get a message with each consumer's job status",
                   parameters=[CHANNEL_TOKEN, ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str, message_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        message = Message.objects.select_related("producer").filter(channel=channel, message_id=message_id).first()
        if message is None:
            raise NotFound("message_not_found", "message not found")
        from jobs.models import Job, JobStatus

        jobs = Job.objects.filter(message=message).select_related("consumer").order_by("id")
        payload = bytes(message.payload)
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            text = base64.b64encode(payload).decode()
        return Response({
            "ID": message.message_id,
            "Payload": text,
            "ContentType": message.content_type,
            "Priority": message.priority,
            "ProducedBy": message.producer.name,
            "ProducerID": message.producer.producer_id,
            "ReceivedAt": rfc3339(message.received_at),
            "DispatchedAt": rfc3339(message.dispatched_at),
            "Status": Message.Status(message.status).name,
            "Headers": message.headers or {},
            "Jobs": [
                {
                    "ID": job_xid(j.pk),
                    "ListenerEndpoint": j.consumer.callback_url,
                    "ListenerName": j.consumer.name,
                    "ConsumerID": j.consumer.consumer_id,
                    "Status": JobStatus(j.status).name,
                    "RetryCount": j.retry_count,
                    "StatusChangedAt": rfc3339(j.status_changed_at),
                }
                for j in jobs
            ],
        })


class MessagesStatusView(APIView):
    @extend_schema(summary="Message and job counts of a channel", parameters=[CHANNEL_TOKEN, ADMIN_PARAM],
                   responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        message_counts = counts_for(scope=MESSAGE, owner_ids=[channel.pk]).get(channel.pk, {})
        counts = {
            status.name: {
                "Count": message_counts.get(status.value, 0),
                "Links": {"messages": f"/channel/{channel_id}/messages?status={status.value}"},
            }
            for status in Message.Status
        }
        from jobs import scheduling

        scheduled_counts = counts_for(scope=scheduling.SCOPE, owner_ids=[channel.pk]).get(channel.pk, {})
        for status in (scheduling.SCHEDULED, scheduling.DISPATCHED):
            counts[f"SCHEDULED_{ScheduledMessage.Status(status).name}"] = {
                "Count": scheduled_counts.get(status, 0),
                "Links": {"messages": f"/channel/{channel_id}/scheduled-messages?status={status}"},
            }
        body = {"counts": counts}
        next_at = scheduling.scheduled_next_at(channel_pk=channel.pk)
        if next_at is not None:
            body["next_scheduled_message_at"] = rfc3339(next_at)
        from consumers.models import Consumer
        from jobs.models import JobStatus

        consumers = list(Consumer.objects.filter(channel=channel).only("id", "consumer_id", "max_queued"))
        job_counts = counts_for(scope=JOB, owner_ids=[c.pk for c in consumers])
        body["consumers"] = {
            c.consumer_id: {s.name: job_counts.get(c.pk, {}).get(s.value, 0) for s in JobStatus}
            for c in consumers
        }
        # flow control: each consumer's backlog (QUEUED jobs) and its cap (null: unlimited)
        body["backlog"] = {
            c.consumer_id: {"Backlog": job_counts.get(c.pk, {}).get(JobStatus.QUEUED.value, 0),
                            "MaxQueued": c.max_queued}
            for c in consumers
        }
        return Response(body)


# --- health and metrics ---------------------------------------------------------------------------

class StatusView(APIView):
    @extend_schema(
        summary="Health: database reachable, and the seed this process applied",
        description="SeedApplied / SeedHash / SeedAppliedAt: the seed configuration this broker process applied "
                    "(BROKER_SEED_CONFIG at start-up), so brokers sharing a database each show their own; "
                    "AppStatus 3 once any seed was applied to the database. SeedData (without tokens) "
                    "with the admin token.",
        responses={200: OBJ, 503: OBJ})
    def get(self, request):
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
            database_seeded = SeedState.objects.filter(pk=1, applied_at__isnull=False).exists()
        except Exception:  # noqa: BLE001 - any database failure means unhealthy
            return Response({"Database": "unreachable", "AppStatus": 1}, status=503)
        applied = seed_applied()
        body = {
            "Database": "ok",
            "SeedApplied": applied is not None,
            "SeedHash": applied.digest if applied else "",
            "SeedAppliedAt": rfc3339(applied.applied_at) if applied else None,
            "AppStatus": 3 if database_seeded else 1,
        }
        if applied and is_admin(request):
            body["SeedData"] = applied.data
        return Response(body)
