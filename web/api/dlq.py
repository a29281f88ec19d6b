"""HTTP API for dead letters, job counts, signing-secret rotation and scheduled messages.

webhook-broker's endpoints and shapes, except that reading a consumer's dead letters needs its
channel and consumer tokens (or the admin token), and the global status endpoints the admin token.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.counters import JOB, counts_for
from broker.errors import Forbidden, InvalidInput, NotFound
from broker.models import Channel, ScheduledMessage
from broker.tokens import tokens_equal
from broker.xid import job_xid
from consumers.models import Consumer
from consumers.services import consumer_rotate_secret
from jobs.models import Job, JobStatus
from jobs.ops.dead_jobs import dead_jobs_listed, jobs_delete_dead, jobs_requeue_dead
from jobs.publish import scheduled as scheduling
from web.api.common import (ADMIN_PARAM, CHANNEL_TOKEN, ERROR, LIST, OBJ, PAGE_PARAMS, channel_or_404,
                            channel_rows_by_status, form_value, require_channel_reader, statuses_param_schema)
from web.api.consumers import consumer_or_404, require_consumer_or_admin
from web.api.pagination import paginate
from web.api.publishing import publish_context
from web.api.representations import message_url, rfc3339
from web.auth import is_admin, require_admin, require_registry

CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
PUBLISHER_PARAMS = [
    CHANNEL_TOKEN,
    OpenApiParameter("X-Broker-Producer-ID", OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter("X-Broker-Producer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER),
]


def _q(value: str) -> str:
    return quote(value, safe="-_.~")


# --- dead letters -------------------------------------------------------------------------------

class DeadLetterQueueView(APIView):
    parser_classes = [FormParser, MultiPartParser]  # webhook-broker: the requeue POST is a form (else 415)

    @extend_schema(
        summary="List a consumer's dead jobs (25 per page, newest first)",
        parameters=[CHANNEL_TOKEN, CONSUMER_TOKEN, ADMIN_PARAM, *PAGE_PARAMS],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description='{"DeadJobs": [...], "Pages": {...}}'),
                   400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        require_consumer_or_admin(request, channel, consumer)
        base = f"/channel/{_q(channel_id)}/consumer/{_q(consumer_id)}"
        dead = dead_jobs_listed(consumer_pk=consumer.pk).select_related("message")  # with dead_reason

        def item(job: Job) -> dict:
            return {
                "ID": job_xid(job.pk),
                "ListenerEndpoint": consumer.callback_url,
                "ListenerName": consumer.name,
                "Status": "DEAD",
                "StatusChangedAt": rfc3339(job.status_changed_at),
                "RetryCount": job.retry_count,
                "MessageID": job.message.message_id,
                "MessageURL": message_url(_q(channel_id), _q(job.message.message_id)),
                "JobRequeueURL": f"{base}/job/{job_xid(job.pk)}/requeue-dead-job",
                "Reason": job.dead_reason or "",
                "ExpiresAt": rfc3339(job.expires_at) if job.expires_at else None,
            }

        page = paginate(request, dead, path=f"{base}/dlq", item=item)
        return Response({"DeadJobs": page["Result"], "Pages": page["Pages"]})

    @extend_schema(
        summary="Requeue every dead job of the consumer",
        description="Form field requeue=<consumer token> (webhook-broker). Dead jobs go back to QUEUED "
                    "with the retry count reset and are delivered again.",
        request={"application/x-www-form-urlencoded": {
            "type": "object", "required": ["requeue"],
            "properties": {"requeue": {"type": "string", "description": "the consumer's token (400 invalid_requeue_token "
                                                                        "when missing or wrong)"}}}},
        responses={202: OBJ, 400: ERROR, 404: ERROR, 415: ERROR},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        given = form_value(request, "requeue")
        if not tokens_equal(given, consumer.token):
            raise InvalidInput("invalid_requeue_token", "`requeue` form param must match consumer token")
        requeued = jobs_requeue_dead(consumer_pk=consumer.pk, reason="dlq-requeue")
        return Response({"requeuedCount": requeued}, status=202)

    @extend_schema(
        summary="Delete every dead job of the consumer",
        parameters=[CHANNEL_TOKEN, CONSUMER_TOKEN, ADMIN_PARAM],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description='{"deletedCount": n}'),
                   401: ERROR, 403: ERROR, 404: ERROR},
    )
    def delete(self, request, channel_id: str, consumer_id: str):
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        require_consumer_or_admin(request, channel, consumer)
        return Response({"deletedCount": jobs_delete_dead(consumer_pk=consumer.pk)})


class DlqStatusView(APIView):
    @extend_schema(summary="Dead job counts of every consumer that has dead jobs (admin)",
                   parameters=[ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR})
    def get(self, request):
        require_registry(request)
        counts = counts_for(scope=JOB)
        dead = {pk: n.get(JobStatus.DEAD, 0) for pk, n in counts.items() if n.get(JobStatus.DEAD, 0) > 0}
        consumers = Consumer.objects.filter(pk__in=list(dead)).select_related("channel").order_by("channel_id", "id")
        return Response({"consumers": [
            {"channelId": c.channel.channel_id, "channelName": c.channel.name, "consumerId": c.consumer_id,
             "consumerName": c.name, "deadCount": dead[c.pk]}
            for c in consumers
        ]})


class JobStatusView(APIView):
    @extend_schema(
        summary="Job counts per channel, consumer and status (admin)",
        description='{"<channelId>": {"<consumerId>": [{"status": 1001, "statusName": "QUEUED", "count": n}]}}; '
                    "from maintained counters, so it stays fast on any number of jobs.",
        parameters=[ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR},
    )
    def get(self, request):
        require_registry(request)
        counts = counts_for(scope=JOB)
        body: dict = {}
        for c in Consumer.objects.select_related("channel").order_by("channel_id", "id"):
            per_status = counts.get(c.pk, {})
            body.setdefault(c.channel.channel_id, {})[c.consumer_id] = [
                {"status": s.value, "statusName": s.name, "count": per_status[s.value]}
                for s in JobStatus if per_status.get(s.value, 0) > 0
            ]
        return Response(body)


# --- signing secret -----------------------------------------------------------------------------

GRACE_MAX = 366 * 24 * 3600  # a year (and a day)
ROTATE_REQUEST = {"type": "object", "properties": {"graceSeconds": {
    "type": "number", "minimum": 0, "maximum": GRACE_MAX,
    "description": "seconds the previous secret keeps signing too (default BROKER_SECRET_ROTATION_GRACE)"}}}


class RotateSecretView(APIView):
    @extend_schema(
        summary="Rotate a consumer's signing secret (admin)",
        description="Returns the new secret. Callbacks carry signatures with both the new and the old "
                    "secret for graceSeconds (form field, default BROKER_SECRET_ROTATION_GRACE = 24 h).",
        parameters=[ADMIN_PARAM], request={"application/x-www-form-urlencoded": ROTATE_REQUEST},
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        require_admin(request)
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        raw = form_value(request, "graceSeconds")
        grace = float(settings.BROKER_SECRET_ROTATION_GRACE)
        if raw is not None and raw.strip():
            try:
                grace = float(raw)
            except ValueError:
                raise InvalidInput("invalid_graceSeconds", "graceSeconds must be a number") from None
            if not 0 <= grace <= GRACE_MAX:
                raise InvalidInput("invalid_graceSeconds", "graceSeconds must be between 0 and a year")
        secret = consumer_rotate_secret(consumer=consumer, grace_seconds=grace)
        consumer.refresh_from_db(fields=["previous_secret_expires_at"])
        return Response({"SigningSecret": secret,
                         "PreviousSecretExpiresAt": rfc3339(consumer.previous_secret_expires_at)})


# --- scheduled messages -------------------------------------------------------------------------

def scheduled_url(channel_id: str, message_id: str) -> str:
    return f"/channel/{_q(channel_id)}/scheduled-message/{_q(message_id)}"


def scheduled_repr(s: ScheduledMessage, channel_id: str) -> dict:
    payload = bytes(s.payload)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = base64.b64encode(payload).decode()
    return {
        "id": str(s.pk),
        "messageId": s.message_id,
        "contentType": s.content_type,
        "priority": s.priority,
        "producedBy": s.producer.producer_id,
        "dispatchSchedule": rfc3339(s.dispatch_at),
        "dispatchedAt": rfc3339(s.dispatched_at),
        "status": ScheduledMessage.Status(s.status).name,
        "payload": text,
        "headers": s.headers or {},
        "messageUrl": message_url(_q(channel_id), _q(s.message_id)) if s.status == scheduling.DISPATCHED else None,
        "error": s.error or None,
    }


class ScheduledMessagesView(APIView):
    @extend_schema(
        summary="List a channel's scheduled messages (newest first)",
        description='{"result": [relative URLs], "pages": {...}} as webhook-broker, also as "Result"/"Pages".',
        parameters=[CHANNEL_TOKEN, ADMIN_PARAM, statuses_param_schema(ScheduledMessage.Status), *PAGE_PARAMS],
        responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def get(self, request, channel_id: str):
        qs = channel_rows_by_status(request, channel_id, ScheduledMessage)
        page = paginate(request, qs, path=f"/channel/{_q(channel_id)}/scheduled-messages", keep_params=("status",),
                        item=lambda s: scheduled_url(channel_id, s.message_id))
        return Response({"result": page["Result"], "pages": page["Pages"], **page})


class ScheduledMessageView(APIView):
    @extend_schema(summary="Get a scheduled message", parameters=[CHANNEL_TOKEN, ADMIN_PARAM],
                   responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str, message_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        scheduled = (ScheduledMessage.objects.select_related("producer")
                     .filter(channel=channel, message_id=message_id).first())
        if scheduled is None:
            raise NotFound("scheduled_message_not_found", "scheduled message not found")
        return Response(scheduled_repr(scheduled, channel_id))

    @extend_schema(
        summary="Cancel a scheduled message before it is dispatched",
        description="The publishing credentials (channel token, producer id and token) of the producer "
                    "that scheduled it, or the admin token. 204; 409 once dispatched.",
        parameters=[*PUBLISHER_PARAMS, ADMIN_PARAM],
        responses={204: None, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR},
    )
    def delete(self, request, channel_id: str, message_id: str):
        if is_admin(request):
            channel = channel_or_404(channel_id)
        else:
            ctx = publish_context(request, channel_id)
            channel = Channel(pk=ctx.channel_pk, channel_id=channel_id)
            owner = (ScheduledMessage.objects.filter(channel_id=ctx.channel_pk, message_id=message_id)
                     .values_list("producer_id", flat=True).first())
            if owner is not None and owner != ctx.producer_pk:
                raise Forbidden("forbidden", "only the producer that scheduled the message may cancel it")
        scheduling.scheduled_message_cancel(channel_pk=channel.pk, message_id=message_id)
        return Response(status=204)
