"""HTTP API for a channel's messages: list them, publish a batch, read one with its jobs, and
the message and job counts (messages-status)."""

from __future__ import annotations

import base64
from urllib.parse import quote

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.counters import JOB, MESSAGE, counts_for
from broker.errors import NotFound, Unprocessable
from broker.message_types import message_type_parse, ttl_parse
from broker.models import Message, ScheduledMessage
from broker.tracing import trace_context_parse
from broker.xid import job_xid
from consumers.models import Consumer
from eventtypes.validation import message_validate
from jobs.models import Job, JobStatus
from jobs.publish import scheduled as scheduling
from jobs.publish.messages import messages_publish, partition_headers
from web.api.common import (ADMIN_PARAM, CHANNEL_TOKEN, ERROR, LIST, OBJ, PAGE_PARAMS, channel_or_404,
                            channel_rows_by_status, read_body, require_channel_reader, statuses_param_schema)
from web.api.pagination import paginate
from web.api.publish_schemas import batch_request
from web.api.publishing import (FILTER_EXPIRY_PARAMS, PARTITION_PARAMS, PUBLISH_PARAMS, TRACE_PARAMS, batch_parse,
                                publish_context)
from web.api.representations import message_url, rfc3339


class MessagesView(APIView):
    parser_classes = []

    @extend_schema(
        summary="List messages of a channel",
        parameters=[CHANNEL_TOKEN, ADMIN_PARAM, statuses_param_schema(Message.Status), *PAGE_PARAMS],
        responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def get(self, request, channel_id: str):
        qs = channel_rows_by_status(request, channel_id, Message)
        return Response(paginate(request, qs, path=f"/channel/{channel_id}/messages", keep_params=("status",),
                                 item=lambda m: message_url(channel_id, quote(m.message_id, safe="-_.~"))))

    @extend_schema(
        summary="Publish a batch of up to 1,000 messages in one transaction",
        description='JSON list of {"MessageID"?, "Priority"?, "ContentType"?, "PartitionKey"?, "Gate"?, "Type"?, '
                    '"TTL"?, "traceparent"?, "tracestate"?, "Payload"}. X-Broker-Message-Type / X-Broker-Message-TTL '
                    "and the traceparent / tracestate headers apply to items without their own. Answers per "
                    "message: created, duplicate, or invalid (its type's event type refuses it: error "
                    "schema_validation_failed or unknown_event_type, detail, path; the others are published). "
                    "201 when at least one was created.",
        parameters=[*PUBLISH_PARAMS, *PARTITION_PARAMS, *FILTER_EXPIRY_PARAMS, *TRACE_PARAMS],
        request=batch_request(settings.BROKER_MAX_BATCH_MESSAGES),
        responses={200: OBJ, 201: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 413: ERROR,
                   429: ERROR},
    )
    def post(self, request, channel_id: str):
        ctx = publish_context(request, channel_id)
        limit = settings.BROKER_MAX_PAYLOAD_BYTES * 4 + settings.BROKER_MAX_BATCH_MESSAGES * 1024
        partition_key, gate = partition_headers(request.headers)
        message_type = message_type_parse(request.headers.get("X-Broker-Message-Type"))
        ttl = ttl_parse(request.headers.get("X-Broker-Message-TTL"))
        trace = trace_context_parse(request.headers.get("traceparent"), request.headers.get("tracestate"))
        messages = batch_parse(read_body(request, max(limit, 64 * 1024 * 1024)))
        for m in messages:  # partitions, filters, expiry: the request's headers apply to every message of the batch
            if m.partition_key is None and partition_key is not None:
                m.partition_key, m.gate = partition_key, gate
            m.type = m.type if m.type is not None else message_type
            m.ttl = m.ttl if m.ttl is not None else ttl
            m.trace = m.trace or trace  # trace context: the request's for items without their own
        refusals = batch_validate(channel_id, messages)  # event types (issue 37): those items alone fail
        valid = [m for i, m in enumerate(messages) if i not in refusals]
        published = iter(messages_publish(ctx=ctx, messages=valid) if valid else [])
        result = []
        for i, m in enumerate(messages):
            if i in refusals:
                refusal = refusals[i]
                result.append({"MessageID": m.message_id, "Status": "invalid", "error": refusal.code,
                               "detail": refusal.detail, "path": refusal.path})
                continue
            mid, ok = next(published)
            result.append({"MessageID": mid, "Status": "created" if ok else "duplicate",
                           "Location": message_url(channel_id, quote(mid, safe="-_.~"))})
        created = sum(1 for r in result if r["Status"] == "created")
        body = {"Created": created, "Duplicates": sum(1 for r in result if r["Status"] == "duplicate"),
                "Invalid": len(refusals), "Result": result}
        return Response(body, status=201 if created else 200)


def batch_validate(channel_id: str, messages: list) -> dict[int, Unprocessable]:
    """Each message of a batch held to the channel's event types (``message_validate``): the refusal
    of each one that fails, by its index."""
    refusals = {}
    for i, m in enumerate(messages):
        try:
            message_validate(channel_id=channel_id, message_type=m.type, payload=m.payload, content_type=m.content_type)
        except Unprocessable as exc:
            refusals[i] = exc
    return refusals


class MessageView(APIView):
    @extend_schema(summary="Get a message with each consumer's job status",
                   parameters=[CHANNEL_TOKEN, ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str, message_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        message = Message.objects.select_related("producer").filter(channel=channel, message_id=message_id).first()
        if message is None:
            raise NotFound("message_not_found", "message not found")
        jobs = Job.objects.filter(message=message).select_related("consumer").order_by("id")
        payload = bytes(message.payload)
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
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
            "Type": message.type,
            "TraceParent": message.traceparent,  # trace context (W3C), as stored
            "TraceState": message.tracestate,
            "ExpiresAt": rfc3339(message.expires_at) if message.expires_at else None,
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
