"""The hot pull routes as plain functions (request -> HttpResponse): queued-jobs GET, the job
state POST, pull and ack.

One implementation serves two callers: the DRF views in ``web.api.pull.views`` (the OpenAPI schema and
every request the fast lane leaves to the full stack) and ``web.api.fast_lane.FastLaneMiddleware``
(the common case, without URL resolving, DRF dispatch or the rest of the middleware chain). They
read headers from ``request.META`` (what ``request.headers`` is built from, without building it)
and answer JSON bytes; errors are raised as domain errors and rendered by the caller.
"""

from __future__ import annotations

import json

from django.http import HttpResponse

from broker.errors import DomainError, Forbidden, InvalidInput
from jobs.pull.ack import ack_request_parse, gate_parse, job_gate_move, jobs_ack
from jobs.pull.auth import PullContext, pull_authenticate
from jobs.pull.claim import pull_request_parse
from jobs.pull.fields import limit_parse, receipt_repr, timeout_parse
from jobs.pull.serve import pull_serve
from jobs.pull.shapes import claimed_repr
from jobs.pull.spec import SPEC_STATES, job_transition, queued_jobs_list
from web.api.common import read_body
from web.auth import is_admin
from web.server.http import HUNG_UP, peer_hung_up

# The JSON control bodies are small (an ack of 1,000 jobs is ~60 KB): anything past this is a
# 413 before it is read or parsed.
JSON_BODY_LIMIT = 1024 * 1024
ADMIN_META = "HTTP_X_BROKER_ADMIN_TOKEN"
CHANNEL_TOKEN_META = "HTTP_X_BROKER_CHANNEL_TOKEN"
CONSUMER_TOKEN_META = "HTTP_X_BROKER_CONSUMER_TOKEN"
RECEIPT_HEADER = "X-Broker-Receipt"


def json_response(body, status: int = 200) -> HttpResponse:
    return HttpResponse(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
                        status=status, content_type="application/json")


def json_body(request, *, empty=None, credentials_check=None):
    """The body as JSON; malformed JSON or bytes that are not UTF-8 are a 400, never a 500. A large
    body is read only after ``credentials_check`` passed (``read_body``)."""
    raw = read_body(request, JSON_BODY_LIMIT, credentials_check=credentials_check)
    if not raw.strip():
        if empty is None:
            raise InvalidInput("malformed_request", "a JSON body is required")
        return empty
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("malformed_json", "body is not valid JSON") from None


def authenticate(request, channel_id: str, consumer_id: str, *, allow_admin: bool = False,
                 require_pull: bool = True, job_id: str | None = None) -> PullContext:
    """The channel and consumer tokens (or, where ``allow_admin``, the admin token)."""
    meta = request.META
    admin = False
    if allow_admin and meta.get(ADMIN_META) is not None:
        admin = is_admin(request)
        if not admin and meta.get(CONSUMER_TOKEN_META) is None:
            raise Forbidden("forbidden", "admin token does not match")
    return pull_authenticate(
        channel_id=channel_id, consumer_id=consumer_id,
        channel_token=meta.get(CHANNEL_TOKEN_META), consumer_token=meta.get(CONSUMER_TOKEN_META),
        admin=admin, require_pull=require_pull, job_id=job_id,
    )


def queued_jobs_get(request, channel_id: str, consumer_id: str) -> HttpResponse:
    ctx = authenticate(request, channel_id, consumer_id, allow_admin=True)
    limit = limit_parse(request.GET.get("limit"))
    return json_response({"Result": queued_jobs_list(ctx=ctx, limit=limit)})


def job_state_post(request, channel_id: str, consumer_id: str, job_id: str) -> HttpResponse:
    """The spec's state change: one statement authenticates and moves (``pull.job_transition``)."""
    meta = request.META
    try:
        data = json_body(request, credentials_check=lambda: authenticate(request, channel_id, consumer_id, job_id=job_id))
        if not isinstance(data, dict):
            raise InvalidInput("malformed_request", "body must be a JSON object")
        fields = {str(k).lower(): v for k, v in data.items()}
        next_state = fields.get("nextstate")
        if next_state == "QUEUED" and "gate" in fields:  # partitions: a handler-driven gate move
            gate, payload = gate_parse(fields.get("gate"), fields.get("payload"))
            ctx = authenticate(request, channel_id, consumer_id, job_id=job_id)
            job_gate_move(ctx=ctx, gate=gate, payload=payload)
            return HttpResponse(status=202)
        if not isinstance(next_state, str) or next_state not in SPEC_STATES:
            raise InvalidInput("invalid_next_state", "NextState must be INFLIGHT, DELIVERED or DEAD")
        incremental = timeout_parse(fields.get("incrementaltimeout"))
    except DomainError:
        authenticate(request, channel_id, consumer_id, job_id=job_id)  # auth errors come first
        raise
    receipt = job_transition(
        channel_id=channel_id, consumer_id=consumer_id, job_id=job_id,
        channel_token=meta.get(CHANNEL_TOKEN_META), consumer_token=meta.get(CONSUMER_TOKEN_META),
        next_state=next_state, incremental_timeout=incremental,
    )
    response = HttpResponse(status=202)
    if receipt is not None:  # a claim (INFLIGHT): its receipt, for an ack or progress (the body stays empty)
        response[RECEIPT_HEADER] = receipt_repr(receipt)
    return response


def client_gone_check(request):
    """A check whether the client of ``request`` has hung up, for a long-poll to ask before it claims:
    the broker's web server says so itself (``broker.client_gone``: the peer closed or half-closed its
    side); under gunicorn's own workers its socket is polled (``gunicorn.socket``); None when the
    server gives neither."""
    gone = request.META.get("broker.client_gone")
    if gone is not None:
        return gone
    sock = request.META.get("gunicorn.socket")
    if sock is None or not HUNG_UP:
        return None
    return lambda: peer_hung_up(sock)


def pull_post(request, channel_id: str, consumer_id: str) -> HttpResponse:
    ctx = authenticate(request, channel_id, consumer_id)
    req = pull_request_parse(json_body(request, empty={}))
    req.client_gone = client_gone_check(request)
    served = pull_serve(ctx=ctx, req=req)
    items = [claimed_repr(j) for j in served.jobs]
    body = {"Result": items}
    pin = served.pin_id
    if pin:
        for item in items:
            item["PinId"] = pin
        body["PinId"] = pin
    response = json_response(body)
    if pin:
        response["X-Broker-Pin-Id"] = pin
    return response


def ack_post(request, channel_id: str, consumer_id: str) -> HttpResponse:
    ctx = authenticate(request, channel_id, consumer_id)
    items = ack_request_parse(json_body(request))
    return json_response({"Result": jobs_ack(ctx=ctx, items=items)})
