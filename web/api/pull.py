"""HTTP API for pull consumers: the spec's endpoints and the fast path (pull, ack, progress).

Views only translate HTTP: parse, call ``jobs.pull``, answer. The hot views (queued-jobs,
job state, pull, ack) skip DRF's parsers, authenticators and renderers and write JSON bytes
themselves: per-request framework overhead is a measurable share of a 100-job pull.
"""

from __future__ import annotations

import json

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from broker.errors import DomainError, Forbidden, InvalidInput, Locked
from jobs import groups, pull
from jobs.advisories import advisories_list
from web.api.common import ADMIN_PARAM, CHANNEL_TOKEN, ERROR, OBJ, read_body
from web.auth import ADMIN_HEADER, is_admin

CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
TOKENS = [CHANNEL_TOKEN, CONSUMER_TOKEN]
ACCEPTED = OpenApiResponse(description="Accepted (empty body)")
JOBS = OpenApiResponse(OpenApiTypes.OBJECT, description=(
    '{"Result": [{"ID", "Priority", "IncrementalTimeout", '
    '"Message": {"MessageID", "Payload", "ContentType", "Headers"}}]}'))
AUTH_ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR, 413: ERROR}
# The JSON control bodies are small (an ack of 1,000 jobs is ~60 KB): anything past this is a
# 413 before it is read or parsed.
JSON_BODY_LIMIT = 1024 * 1024


def json_response(body, status: int = 200) -> HttpResponse:
    return HttpResponse(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
                        status=status, content_type="application/json")


def json_body(request, *, empty=None):
    """The body as JSON; malformed JSON or bytes that are not UTF-8 are a 400, never a 500."""
    raw = read_body(request, JSON_BODY_LIMIT)
    if not raw.strip():
        if empty is None:
            raise InvalidInput("malformed_request", "a JSON body is required")
        return empty
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("malformed_json", "body is not valid JSON") from None


def authenticate(request, channel_id: str, consumer_id: str, *, allow_admin: bool = False,
                 require_pull: bool = True, job_id: str | None = None) -> pull.PullContext:
    """The channel and consumer tokens (or, where ``allow_admin``, the admin token)."""
    admin = False
    if allow_admin and request.headers.get(ADMIN_HEADER) is not None:
        admin = is_admin(request)
        if not admin and request.headers.get("X-Broker-Consumer-Token") is None:
            raise Forbidden("forbidden", "admin token does not match")
    return pull.pull_authenticate(
        channel_id=channel_id, consumer_id=consumer_id,
        channel_token=request.headers.get("X-Broker-Channel-Token"),
        consumer_token=request.headers.get("X-Broker-Consumer-Token"),
        admin=admin, require_pull=require_pull, job_id=job_id,
    )


class JsonOnly(BaseContentNegotiation):
    """Always JSON, without parsing the Accept header (our hot views answer JSON bytes anyway)."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


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
        parameters=[*TOKENS, ADMIN_PARAM, OpenApiParameter("limit", OpenApiTypes.INT)],
        responses={200: JOBS, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True)
        limit = pull.limit_parse(request.GET.get("limit"))
        return json_response({"Result": pull.queued_jobs_list(ctx=ctx, limit=limit)})

    @extend_schema(
        summary="Purge a consumer's QUEUED jobs (push or pull consumer)",
        description="Admin token, or the channel and consumer tokens. Deletes the consumer's QUEUED jobs in "
                    "batches (in-flight, delivered and dead jobs stay); olderThan (RFC 3339 time, or an age in "
                    "seconds) limits it to jobs created before then. Every purged job gets a history row "
                    '(reason "purged"). Answers {"deletedCount": n}.',
        parameters=[*TOKENS, ADMIN_PARAM, OpenApiParameter("olderThan", OpenApiTypes.STR)],
        responses={200: OBJ, **AUTH_ERRORS},
    )
    def delete(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False)
        return json_response({"deletedCount": pull.queued_jobs_purge(ctx=ctx, older_than=request.GET.get("olderThan"))})


class JobView(HotView):
    @extend_schema(
        summary="Get a job of a pull consumer (status and links)",
        parameters=[*TOKENS, ADMIN_PARAM], responses={200: OBJ, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, job_id=job_id)
        return json_response(pull.job_detail(ctx=ctx))

    @extend_schema(
        summary="Change a job's state (pull consumers)",
        description='JSON {"NextState": "INFLIGHT"|"DELIVERED"|"DEAD", "IncrementalTimeout": seconds}. '
                    "Allowed: QUEUED->INFLIGHT, INFLIGHT->DELIVERED, INFLIGHT->DEAD, DEAD->INFLIGHT "
                    "(retry + 1). The same state is a 202 without change. IncrementalTimeout only with "
                    "INFLIGHT from QUEUED or DEAD. Partitions: {\"NextState\": \"QUEUED\", \"Gate\": n, "
                    "\"Payload\"?} moves an INFLIGHT partitioned job to a higher gate. Anything else is a 400.",
        parameters=TOKENS, request={"application/json": OpenApiTypes.OBJECT}, responses={202: ACCEPTED, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        try:
            data = json_body(request)
            if not isinstance(data, dict):
                raise InvalidInput("malformed_request", "body must be a JSON object")
            fields = {str(k).lower(): v for k, v in data.items()}
            next_state = fields.get("nextstate")
            if next_state == "QUEUED" and "gate" in fields:  # partitions: a handler-driven gate move
                gate, payload = pull.gate_parse(fields.get("gate"), fields.get("payload"))
                ctx = authenticate(request, channel_id, consumer_id, job_id=job_id)
                pull.job_gate_move(ctx=ctx, gate=gate, payload=payload)
                return HttpResponse(status=202)
            if not isinstance(next_state, str) or next_state not in pull.SPEC_STATES:
                raise InvalidInput("invalid_next_state", "NextState must be INFLIGHT, DELIVERED or DEAD")
            incremental = pull.timeout_parse(fields.get("incrementaltimeout"))
        except DomainError:
            authenticate(request, channel_id, consumer_id, job_id=job_id)  # auth errors come first
            raise
        pull.job_transition(
            channel_id=channel_id, consumer_id=consumer_id, job_id=job_id,
            channel_token=request.headers.get("X-Broker-Channel-Token"),
            consumer_token=request.headers.get("X-Broker-Consumer-Token"),
            next_state=next_state, incremental_timeout=incremental,
        )
        return HttpResponse(status=202)

    @extend_schema(
        summary="Delete a dead job (push or pull consumer)",
        parameters=[*TOKENS, ADMIN_PARAM], responses={204: None, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def delete(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False, job_id=job_id)
        pull.job_delete_dead(ctx=ctx)
        return HttpResponse(status=204)


class JobRequeueView(HotView):
    @extend_schema(
        summary="Requeue one dead job of a pull consumer (DEAD -> QUEUED, retry count reset)",
        parameters=[*TOKENS, ADMIN_PARAM], request=None, responses={202: ACCEPTED, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, job_id=job_id)
        pull.job_requeue_dead(ctx=ctx)
        return HttpResponse(status=202)


class JobProgressView(HotView):
    @extend_schema(
        summary="Extend an in-flight job's deadline (work in progress)",
        description='JSON {"IncrementalTimeout": seconds} (optional: the job\'s stored one). The new deadline '
                    "is now + stopTimeout + rationalDelay + IncrementalTimeout, never earlier than before; "
                    "the retry count does not change. 409 when the job is not INFLIGHT.",
        parameters=TOKENS, request={"application/json": OpenApiTypes.OBJECT}, responses={200: OBJ, 409: ERROR, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str, job_id: str):
        ctx = authenticate(request, channel_id, consumer_id, job_id=job_id)
        data = json_body(request, empty={})
        if not isinstance(data, dict):
            raise InvalidInput("malformed_request", "body must be a JSON object")
        fields = {str(k).lower(): v for k, v in data.items()}
        incremental = pull.timeout_parse(fields.get("incrementaltimeout"))
        return json_response(pull.job_progress(ctx=ctx, incremental_timeout=incremental))


class PullView(HotView):
    @extend_schema(
        summary="Atomically claim up to `batch` jobs, optionally waiting for them (long-poll)",
        description='JSON {"batch": 1..1000 (default 1), "expires": seconds to wait (default 0, max 60), '
                    '"no_wait": bool (never wait), "max_bytes": payload budget (at least one job), '
                    '"IncrementalTimeout": seconds}. Claimed jobs are INFLIGHT; the answer is the queued-jobs '
                    "shape plus Attempt and Deadline. An expired wait answers an empty Result. "
                    'Priority groups: "group", "min_pending", "min_ack_pending" (overflow), "id" (pin id, '
                    'pinned_client), "priority" 0-9 (prioritized). On such a consumer a waiting pull collects '
                    "jobs until its batch is full or it expires; pinned_client answers carry the pin id "
                    "(X-Broker-Pin-Id header, PinId in the body); 423 pin_id_mismatch / wrong_pin_id.",
        parameters=TOKENS, request={"application/json": OpenApiTypes.OBJECT}, responses={200: JOBS, 423: ERROR, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id)
        req = pull.pull_request_parse(json_body(request, empty={}))
        pull.pull_request_check(ctx=ctx, req=req)
        if ctx.policy == "none":
            jobs = pull.jobs_pull(ctx=ctx, req=req)
            return json_response({"Result": [pull.claimed_repr(j) for j in jobs]})

        result = groups.jobs_pull_grouped(ctx=ctx, req=req)
        if result.wrong_pin and not result.jobs:
            raise Locked("wrong_pin_id", "Nats-Wrong-Pin-Id")
        items = [pull.claimed_repr(j) for j in result.jobs]
        body = {"Result": items}
        pin = result.pin_id if result.jobs and ctx.policy == groups.PINNED else ""
        if pin:
            for item in items:
                item["PinId"] = pin
            body["PinId"] = pin
        response = json_response(body)
        if pin:
            response["X-Broker-Pin-Id"] = pin
        return response


class AckView(HotView):
    @extend_schema(
        summary="Report the outcome of up to 1,000 in-flight jobs in one statement",
        description='JSON {"Jobs": [{"ID", "NextState": "DELIVERED"|"DEAD"|"QUEUED", "Delay": seconds}]}. '
                    'Partitions: {"ID", "NextState": "QUEUED", "Gate": n, "Payload"?} moves the job to gate n '
                    '(above its gate) with Payload as its new payload, answered {"ID", "Status", "Gate"}. '
                    "QUEUED is a negative acknowledgement (retry + 1, redelivered after Delay, DEAD past the "
                    'retry limit). Answered per job: {"Result": [{"ID", "Status", "RetryCount"} or '
                    '{"ID", "Status", "Error": "not_found"|"conflict"}]}.',
        parameters=TOKENS, request={"application/json": OpenApiTypes.OBJECT}, responses={200: OBJ, 413: ERROR, **AUTH_ERRORS},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id)
        items = pull.ack_request_parse(json_body(request))
        return json_response({"Result": pull.jobs_ack(ctx=ctx, items=items)})



class UnpinView(HotView):
    @extend_schema(
        summary="Release the pin of a priority group (pinned_client consumers)",
        description='JSON {"group": "A"}, with the channel and consumer tokens or the admin token. The pin is '
                    "released (advisory consumer_group_unpinned, reason admin) and the next job pins another "
                    "waiting pull. Group missing or invalid: 400; not a group of this consumer: 404.",
        parameters=[*TOKENS, ADMIN_PARAM], request={"application/json": OpenApiTypes.OBJECT}, responses={200: OBJ, **AUTH_ERRORS},
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
                    "limit defaults to 100 (max 1000).",
        parameters=[*TOKENS, ADMIN_PARAM, OpenApiParameter("limit", OpenApiTypes.INT)],
        responses={200: OBJ, **AUTH_ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        ctx = authenticate(request, channel_id, consumer_id, allow_admin=True, require_pull=False)
        raw = request.GET.get("limit")
        limit = 100
        if raw not in (None, ""):
            if not raw.isascii() or not raw.isdigit():
                raise InvalidInput("invalid_limit", "limit must be a non-negative integer")
            limit = min(int(raw), 1000)
        return json_response({"Result": advisories_list(consumer_pk=ctx.consumer_pk, limit=limit)})
