"""HTTP API for pull consumers: the spec's endpoints and the fast path (pull, ack, progress).

Views only translate HTTP: parse, call ``jobs.pull`` (the spec path), ``jobs.pull.claim`` (pull, ack,
progress) or ``jobs.pull.purge``, answer. The hot routes (queued-jobs GET, job state POST, pull, ack)
are plain functions in ``web.api.pull.handlers``: these views document them and serve what the fast lane
(``web.api.fast_lane.FastLaneMiddleware``) leaves to the full stack. All views skip DRF's parsers,
authenticators and renderers and write JSON bytes themselves.
"""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from broker.errors import InvalidInput
from jobs.advisories.record import advisories_list
from jobs.pull import groups
from jobs.pull import purge as pull_purge
from jobs.pull.ack import job_progress
from jobs.pull.fields import limit_parse, receipt_parse, timeout_parse
from jobs.pull.spec import job_delete_dead, job_detail, job_requeue_dead
from web.api.common import ADMIN_PARAM, CHANNEL_TOKEN, ERROR, OBJ
from web.api.pull import handlers
from web.api.pull.handlers import authenticate, json_body, json_response
from web.api.pull.schemas import (ACK_REQUEST, ADVISORIES_DEFAULT, ADVISORIES_LIMIT, ADVISORIES_MAX, JOB_STATE_REQUEST,
                                  OLDER_THAN, PROGRESS_REQUEST, PULL_REQUEST, QUEUED_JOBS_LIMIT, UNPIN_REQUEST)

CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
TOKENS = [CHANNEL_TOKEN, CONSUMER_TOKEN]
LISTING = [*TOKENS, ADMIN_PARAM]  # a GET of a list (tokens or admin); each adds its limit
ACCEPTED = OpenApiResponse(description="Accepted (empty body)")
JOBS = OpenApiResponse(OpenApiTypes.OBJECT, description=(
    '{"Result": [{"ID", "Priority", "IncrementalTimeout", '
    '"Message": {"MessageID", "Payload", "ContentType", "Headers"}}]}; a pull\'s jobs also carry '
    '"Attempt", "Deadline" and "Receipt" (the claim\'s opaque receipt, for ack and progress)'))
CLAIM_ACCEPTED = OpenApiResponse(description="Accepted (empty body); a claim (INFLIGHT) carries X-Broker-Receipt",
                                 response=None)
AUTH_ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR, 413: ERROR}
class JsonOnly(BaseContentNegotiation):
    """Always JSON, without parsing the Accept header (our hot views answer JSON bytes anyway)."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def json_post(summary: str, description: str, responses: dict, body: dict, parameters=None):
    """The schema of a pull route that takes a JSON body (tokens as headers)."""
    return extend_schema(summary=summary, description=description, parameters=parameters or TOKENS,
                         request={"application/json": body}, responses=responses)


class HotView(APIView):
    """No DRF parsing, authentication, content negotiation or rendering: the pull endpoints
    authenticate with the broker's tokens themselves and answer JSON bytes (the framework's
    per-request work is a measurable share of a spec-path request)."""

    authentication_classes: list = []
    permission_classes: list = []
    parser_classes: list = []
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonOnly


class QueuedJobsView(HotView):
    @extend_schema(
        summary="List a pull consumer's queued jobs (due, priority descending then oldest first)",
        description="Not a lease: claim a job with POST .../job/{jobId} NextState INFLIGHT, or use .../pull. "
                    "limit defaults to 25, is clipped to 100; a non-integer or negative limit is a 400.",
        parameters=[*LISTING, QUEUED_JOBS_LIMIT], responses={200: JOBS, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        return handlers.queued_jobs_get(request, channel_id, consumer_id)

    @extend_schema(
        summary="Purge a consumer's QUEUED jobs (push or pull consumer)",
        description="Admin token, or the channel and consumer tokens. Deletes the consumer's QUEUED jobs in "
                    "batches (in-flight, delivered and dead jobs stay); olderThan (RFC 3339 time, or an age in "
                    "seconds) limits it to jobs created before then. Every purged job gets a history row "
                    '(reason "purged"). Answers {"deletedCount": n}.',
        parameters=[*TOKENS, ADMIN_PARAM, OLDER_THAN],
        responses={200: OBJ, **AUTH_ERRORS},
    )
    def delete(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False)
        deleted = pull_purge.queued_jobs_purge(ctx=ctx, older_than=request.GET.get("olderThan"))
        return json_response({"deletedCount": deleted})


class JobView(HotView):
    @extend_schema(
        summary="Get a job of a pull consumer (status and links)",
        parameters=[*TOKENS, ADMIN_PARAM], responses={200: OBJ, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, job_id=job_id)
        return json_response(job_detail(ctx=ctx))

    @json_post(
        "Change a job's state (pull consumers)",
        'JSON {"NextState": "INFLIGHT"|"DELIVERED"|"DEAD", "IncrementalTimeout": seconds}. '
        "Allowed: QUEUED->INFLIGHT, INFLIGHT->DELIVERED, INFLIGHT->DEAD, DEAD->INFLIGHT "
        "(retry + 1). The same state is a 202 without change. IncrementalTimeout only with "
        "INFLIGHT from QUEUED or DEAD. Partitions: {\"NextState\": \"QUEUED\", \"Gate\": n, "
        "\"Payload\"?} moves an INFLIGHT partitioned job to a higher gate. Anything else is a 400. "
        "A move to INFLIGHT is a claim: its receipt comes in the X-Broker-Receipt header (for the "
        "Receipt of an ack item or a progress request). 409 message_expired: a claim of a job whose "
        "message expired.",
        responses={202: CLAIM_ACCEPTED, 409: ERROR, **AUTH_ERRORS}, body=JOB_STATE_REQUEST,
        parameters=[*TOKENS, OpenApiParameter(handlers.RECEIPT_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
                                              response=[202], description="a claim's receipt (opaque)")],
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        return handlers.job_state_post(request, channel_id, consumer_id, job_id)

    @extend_schema(
        summary="Delete a dead job (push or pull consumer)",
        parameters=[*TOKENS, ADMIN_PARAM], responses={204: None, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def delete(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False, job_id=job_id)
        job_delete_dead(ctx=ctx)
        return HttpResponse(status=204)


class JobRequeueView(HotView):
    @extend_schema(
        summary="Requeue one dead job of a pull consumer (DEAD -> QUEUED, retry count reset)",
        description="400 job_not_dead when the job is not DEAD; 409 message_expired when its message expired.",
        parameters=[*TOKENS, ADMIN_PARAM], request=None, responses={202: ACCEPTED, 409: ERROR, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, job_id=job_id)
        job_requeue_dead(ctx=ctx)
        return HttpResponse(status=202)


class JobProgressView(HotView):
    @json_post(
        "Extend an in-flight job's deadline (work in progress)",
        'JSON {"IncrementalTimeout": seconds (optional: the job\'s stored one), "Receipt": the '
        "claim's receipt (optional)}. The new deadline is now + stopTimeout + rationalDelay + "
        "IncrementalTimeout, never earlier than before; the retry count does not change. 409 "
        "job_not_inflight when the job is not INFLIGHT; 409 stale_receipt (nothing changes) when "
        "the Receipt is not the job's current claim (it was claimed again since).",
        responses={200: OBJ, 409: ERROR, **AUTH_ERRORS}, body=PROGRESS_REQUEST,
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, job_id=job_id)
        data = json_body(request, empty={})
        if not isinstance(data, dict):
            raise InvalidInput("malformed_request", "body must be a JSON object")
        fields = {str(k).lower(): v for k, v in data.items()}
        incremental = timeout_parse(fields.get("incrementaltimeout"))
        receipt = receipt_parse(fields.get("receipt"))
        return json_response(job_progress(ctx=ctx, incremental_timeout=incremental, receipt=receipt))


def _consumer_post_view(name: str, handler, summary: str, description: str, responses: dict, body: dict):
    """A view whose POST (JSON body) is one of the hot handlers, the function the fast lane calls."""
    class View(HotView):
        @json_post(summary, description, responses=responses, body=body)
        def post(self, request, channel_id: str, consumer_id: str):
            return handler(request, channel_id, consumer_id)

    View.__name__ = View.__qualname__ = name
    return View


PullView = _consumer_post_view(
    "PullView", handlers.pull_post,
    "Atomically claim up to `batch` jobs, optionally waiting for them (long-poll)",
    'JSON {"batch": 1..1000 (default 1), "expires": seconds to wait (default 0, max 60), '
    '"no_wait": bool (never wait), "max_bytes": payload budget (at least one job), '
    '"IncrementalTimeout": seconds}. Claimed jobs are INFLIGHT; the answer is the queued-jobs '
    "shape plus Attempt and Deadline. An expired wait answers an empty Result. "
    'Priority groups: "group", "min_pending", "min_ack_pending" (overflow), "id" (pin id, '
    'pinned_client), "priority" 0-9 (prioritized). On such a consumer a waiting pull collects '
    "jobs until its batch is full or it expires; pinned_client answers carry the pin id "
    "(X-Broker-Pin-Id header, PinId in the body); 423 pin_id_mismatch / wrong_pin_id.",
    responses={200: JOBS, 423: ERROR, **AUTH_ERRORS}, body=PULL_REQUEST,
)
AckView = _consumer_post_view(
    "AckView", handlers.ack_post,
    "Report the outcome of up to 1,000 in-flight jobs in one statement",
    'JSON {"Jobs": [{"ID", "NextState": "DELIVERED"|"DEAD"|"QUEUED", "Delay": seconds}]}. '
    'Partitions: {"ID", "NextState": "QUEUED", "Gate": n, "Payload"?} moves the job to gate n '
    '(above its gate) with Payload as its new payload, answered {"ID", "Status", "Gate"}. '
    "QUEUED is a negative acknowledgement (retry + 1, redelivered after Delay, DEAD past the "
    'retry limit). An item may carry the "Receipt" its job was pulled with: it then settles only '
    "that claim. Answered per job: {\"Result\": [{\"ID\", \"Status\", \"RetryCount\"} or "
    '{"ID", "Status", "Error": "not_found"|"conflict"|"stale_receipt", "Detail"}]} (stale_receipt: '
    "the job was claimed again since; nothing changed, Status is its current one).",
    responses={200: OBJ, 413: ERROR, **AUTH_ERRORS}, body=ACK_REQUEST,
)


class UnpinView(HotView):
    @extend_schema(
        summary="Release the pin of a priority group (pinned_client consumers)",
        description='JSON {"group": "A"}, with the channel and consumer tokens or the admin token. The pin is '
                    "released (advisory consumer_group_unpinned, reason admin) and the next job pins another "
                    "waiting pull. Group missing or invalid: 400; not a group of this consumer: 404.",
        parameters=[*TOKENS, ADMIN_PARAM], request={"application/json": UNPIN_REQUEST},
        responses={200: OBJ, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False)
        data = json_body(request, empty={})
        if not isinstance(data, dict):
            raise InvalidInput("malformed_request", "body must be a JSON object")
        fields = {str(k).lower(): v for k, v in data.items()}
        target = groups.Target(consumer_pk=ctx.consumer_pk, channel_id=ctx.channel_id, consumer_id=ctx.consumer_id,
                               policy=ctx.policy, groups=ctx.groups or [], timeout=ctx.priority_timeout)
        return json_response(groups.group_unpin(target=target, group=fields.get("group"), reason="admin"))


class AdvisoriesView(HotView):
    @extend_schema(
        summary="Recent advisories of a consumer (pins and unpins of its priority groups), oldest first",
        description='{"Result": [{"type", "channel", "consumer", "group", "pinned_id" | "reason", "timestamp"}]}; '
                    "limit defaults to 100 (larger values are clipped to 1000).",
        parameters=[*LISTING, ADVISORIES_LIMIT], responses={200: OBJ, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False)
        limit = limit_parse(request.GET.get("limit"), default=ADVISORIES_DEFAULT, maximum=ADVISORIES_MAX)
        return json_response({"Result": advisories_list(consumer_pk=ctx.consumer_pk, limit=limit)})
