"""HTTP API for the consumer registry: PUT/GET/DELETE a consumer, list a channel's consumers."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import Forbidden, InvalidInput, NotFound, Unauthenticated
from broker.message_types import message_types_parse, message_types_text
from broker.registry import Precondition
from broker.times import rfc3339_parse
from broker.tokens import tokens_equal
from consumers import services
from consumers.filters import filter_parse
from consumers.models import Consumer
from consumers.priority import priority_config_parse
from jobs.ops.consumer_stats import consumer_stats
from jobs.publish.replay import consumer_replay
from jobs.pull import groups
from jobs.pull.doorbell import doorbell_state
from jobs.push.circuit import circuit_state, consumer_circuit_close
from web.api.common import (ADMIN_PARAM, CHANNEL_TOKEN, CONSUMER_TOKEN, ERROR, LIST, OBJ, PAGE_PARAMS, PRECONDITION,
                            PRECONDITION_REQUIRED, channel_or_404, form_number, form_value, with_last_modified)
from web.api.pagination import paginate
from web.api.put_schemas import CONSUMER_PUT, CONSUMER_PUT_FORM, put_request
from web.api.representations import changed_at
from web.auth import is_admin, registry_allowed, require_admin, require_registry


def consumer_or_404(channel, consumer_id: str) -> Consumer:
    consumer = Consumer.objects.filter(channel=channel, consumer_id=consumer_id).first()
    if consumer is None:
        raise NotFound("consumer_not_found", "consumer not found")
    return consumer


def consumer_url(channel_id: str, consumer_id: str) -> str:
    return f"/channel/{channel_id}/consumer/{consumer_id}"


def consumer_repr(consumer: Consumer, *, show_secret: bool) -> dict:
    channel_id = consumer.channel.channel_id
    base = consumer_url(channel_id, consumer.consumer_id)
    body = {
        "ID": consumer.consumer_id,
        "Name": consumer.name,
        "Token": consumer.token,
        "ChangedAt": changed_at(consumer.updated_at),
        "CallbackURL": consumer.callback_url,
        "DeadLetterQueueURL": f"{base}/dlq",
        "Type": consumer.type,
        "ChannelID": channel_id,
        "MaxInFlight": consumer.max_in_flight,
        "MaxDeliveriesPerSecond": consumer.max_deliveries_per_second,
        "ConnectionTimeout": consumer.connection_timeout,
        "MaxRetry": consumer.max_retry,
        "RetryBackoff": consumer.retry_backoff,
        "Paused": consumer.paused,
        "MaxAckPending": consumer.max_ack_pending,
        "MaxQueued": consumer.max_queued,
        "Ordered": consumer.ordered,
        "CircuitBreakerFailures": consumer.circuit_breaker_failures,
        "CircuitBreakerProbeSeconds": consumer.circuit_breaker_probe_seconds,
        "CircuitBreakerOpenAfterSeconds": consumer.circuit_breaker_open_after_seconds,
        "NotifyInterval": consumer.notify_interval,
        "PriorityPolicy": consumer.priority_policy,
        "PriorityTimeout": consumer.priority_timeout,
        "PriorityGroups": groups.groups_state(target=groups.target_for(consumer)),
        "MessageTypes": message_types_text(consumer.message_types),  # filters: as the PUT takes them
        "Filter": consumer.filter,  # content filters (consumers.filters): the object, null for none
    }
    if show_secret:
        body["SigningSecret"] = consumer.signing_secret
    return body


def _positive_int(request, name: str, *, allow_zero: bool = False) -> int | None:
    return form_number(request, name, int, lambda v: (0 if allow_zero else 1) <= v <= 2**31 - 1)


def _positive_float(request, name: str) -> float | None:
    return form_number(request, name, float, lambda v: 0 < v < 1e9, range_text="must be positive")


def _non_negative_int(request, name: str) -> int | None:
    return _positive_int(request, name, allow_zero=True)


def _non_negative_float(request, name: str) -> float | None:
    return form_number(request, name, float, lambda v: 0 <= v < 1e9, range_text="must be a number of seconds >= 0")


# (form field, model field, parser), checked in this order
_FLOW_NUMBERS = (("maxInFlight", "max_in_flight", _positive_int),
                 ("maxDeliveriesPerSecond", "max_deliveries_per_second", _positive_float),
                 ("connectionTimeout", "connection_timeout", _positive_float),
                 ("maxAckPending", "max_ack_pending", _positive_int))
_RETRY_NUMBERS = (("circuitBreakerFailures", "circuit_breaker_failures", _non_negative_int),  # jobs.push.circuit; 0 = off
                  ("circuitBreakerProbeSeconds", "circuit_breaker_probe_seconds", _positive_float),
                  # open only after failing this long with no success (0: on the failures alone)
                  ("circuitBreakerOpenAfterSeconds", "circuit_breaker_open_after_seconds", _non_negative_float),
                  ("notifyInterval", "notify_interval", _positive_float),
                  ("maxRetry", "max_retry", _non_negative_int))


def _numbers_parse(request, table, fields: dict) -> None:
    for name, field, parse in table:
        value = parse(request, name)
        if value is not None:
            fields[field] = value


def consumer_settings_parse(request) -> dict:
    """Optional delivery settings of the consumer PUT, validated, as model fields."""
    fields: dict = {}
    _numbers_parse(request, _FLOW_NUMBERS, fields)
    raw = form_value(request, "maxQueued")
    if raw is not None and raw.strip().lower() in ("unlimited", "none", "0"):
        fields["max_queued"] = None  # back to unlimited
    else:
        value = _positive_int(request, "maxQueued")
        if value is not None:
            fields["max_queued"] = value
    raw = form_value(request, "ordered")  # partitions: one job of a partition in flight, in publish order
    if raw is not None and raw.strip():
        flag = raw.strip().lower()
        if flag not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise InvalidInput("invalid_ordered", "ordered must be true or false")
        fields["ordered"] = flag in ("true", "1", "yes", "on")
    _numbers_parse(request, _RETRY_NUMBERS, fields)
    raw = form_value(request, "retryBackoff")
    if raw is not None and raw.strip():
        fields["retry_backoff"] = services.retry_backoff_parse(raw)
    raw = form_value(request, "signingSecret")
    if raw is not None and raw.strip():
        fields["signing_secret"] = services.signing_secret_validate(raw.strip())
    patterns = message_types_parse(form_value(request, "messageTypes"))  # filters; absent: unchanged
    if patterns is not None:
        fields["message_types"] = patterns or None  # empty: every message
    if hasattr(request.data, "get") and request.data.get("filter") is not None:  # content filters; absent: unchanged
        fields["filter"] = filter_parse(request.data.get("filter"))  # JSON text, or an object in a JSON body
    return fields


class ConsumerListView(APIView):
    @extend_schema(summary="List the consumers of a channel", parameters=[ADMIN_PARAM, *PAGE_PARAMS],
                   responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        return Response(paginate(request, Consumer.objects.filter(channel=channel),
                                 path=f"/channel/{channel_id}/consumers",
                                 item=lambda c: consumer_url(channel_id, c.consumer_id)))


def require_consumer_or_admin(request, channel, consumer) -> bool:
    """Admin token, or the channel and consumer tokens. Returns True for the admin."""
    if is_admin(request):
        return True
    channel_token = request.headers.get("X-Broker-Channel-Token")
    consumer_token = request.headers.get("X-Broker-Consumer-Token")
    if channel_token is None and consumer_token is None:
        if request.headers.get("X-Broker-Admin-Token") is not None:
            raise Forbidden("forbidden", "admin token does not match")
        raise Unauthenticated("unauthorized", "admin token or channel and consumer tokens are required")
    if not tokens_equal(channel_token, channel.token) or not tokens_equal(consumer_token, consumer.token):
        raise Forbidden("forbidden", "token does not match")
    return False


class ConsumerView(APIView):
    @extend_schema(
        summary="Get a consumer (admin token, or its channel and consumer tokens)",
        description="Includes statistics: NumPending (queued), NumAckPending (in flight), NumRedelivered, "
                    "NumWaiting (pulls waiting now, all processes), NumDead, NumDelivered; pull consumers with a "
                    "callbackUrl: Doorbell (Armed, RangAt, Rings, Failures); push consumers: Circuit "
                    "(State CLOSED|OPEN|HALF_OPEN, Since, Failures).",
        parameters=[ADMIN_PARAM, CHANNEL_TOKEN], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        admin = registry_allowed(request) or require_consumer_or_admin(request, channel, consumer)
        body = consumer_repr(consumer, show_secret=admin)
        if not admin:
            body.pop("Token", None)
        body.update(consumer_stats(consumer_pk=consumer.pk, sweep=consumer.is_pull))
        body["Backlog"] = body["NumPending"]  # flow control: QUEUED jobs, against MaxQueued
        if not consumer.is_pull:
            body["Circuit"] = circuit_state(consumer=consumer)
        if consumer.is_pull and consumer.callback_url:
            body["Doorbell"] = doorbell_state(consumer_pk=consumer.pk)
        return with_last_modified(body, consumer)

    @extend_schema(
        summary="Create or update a consumer",
        description="Form fields (or JSON): token, name, callbackUrl, type (push|pull), maxInFlight, "
                    "maxDeliveriesPerSecond, connectionTimeout, maxRetry, retryBackoff, signingSecret, maxAckPending "
                    "(default 1000), maxQueued (default unlimited; 0 or 'unlimited' clears it), notifyInterval (seconds "
                    "> 0, default 1: the doorbell of a pull consumer with a callbackUrl rings at most once "
                    "per interval); push consumers: circuitBreakerFailures (consecutive failed attempts that open "
                    "the circuit, default 10, 0 = off), circuitBreakerProbeSeconds (seconds between probes while "
                    "open, default 30), circuitBreakerOpenAfterSeconds (the circuit opens only after failing this "
                    "long with no successful attempt, default 10, 0 = on the failures alone); pull consumers: "
                    "priorityPolicy (none|overflow|pinned_client|prioritized), priorityGroups (one group name), "
                    "priorityTimeout (seconds, pinned_client default 120; the only priority field that may "
                    "change later); messageTypes (comma-separated type patterns: a type, prefix.* for the prefix "
                    "and anything under it, * for all; empty: all; GET shows them as MessageTypes); filter (a content "
                    "filter, ConsumerFilter: the object in a JSON body or its JSON text as a form field; empty: none; "
                    "GET shows it as Filter); both messageTypes and filter must match.",
        parameters=[ADMIN_PARAM, PRECONDITION], request=put_request(CONSUMER_PUT, CONSUMER_PUT_FORM),
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR, 415: ERROR},
    )
    def put(self, request, channel_id: str, consumer_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        consumer_type = services.consumer_type_parse(form_value(request, "type"))
        fields = consumer_settings_parse(request)
        existing = Consumer.objects.filter(channel=channel, consumer_id=consumer_id).first()
        fields.update(priority_config_parse(
            request.data, existing=existing,
            consumer_type=consumer_type or (existing.type if existing else Consumer.Type.PUSH)))
        consumer, _created = services.consumer_upsert(
            channel=channel, consumer_id=consumer_id, name=form_value(request, "name"),
            token=form_value(request, "token"), callback_url=form_value(request, "callbackUrl"),
            type=consumer_type, settings=fields,
            precondition=Precondition(request.headers.get("If-Unmodified-Since")),
        )
        consumer.channel = channel
        return with_last_modified(consumer_repr(consumer, show_secret=True), consumer)  # 200 on create too

    @extend_schema(summary="Delete a consumer and its jobs", parameters=[ADMIN_PARAM, PRECONDITION_REQUIRED],
                   responses={204: None, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR})
    def delete(self, request, channel_id: str, consumer_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        services.consumer_delete(consumer=consumer,
                                 precondition=Precondition(request.headers.get("If-Unmodified-Since")))
        return Response(status=204)



def consumer_for_admin(request, channel_id: str, consumer_id: str) -> Consumer:
    """The consumer of an admin-only endpoint (401/403 first, then 404s), with its channel."""
    require_admin(request)
    channel = channel_or_404(channel_id)
    consumer = consumer_or_404(channel, consumer_id)
    consumer.channel = channel
    return consumer


class ConsumerPauseView(APIView):
    paused = True

    @extend_schema(summary="Pause a consumer (admin): jobs keep accumulating, nothing is pushed or pulled",
                   parameters=[ADMIN_PARAM], request=None, responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def post(self, request, channel_id: str, consumer_id: str):
        consumer = consumer_for_admin(request, channel_id, consumer_id)
        services.consumer_pause(consumer=consumer, paused=self.paused)
        return with_last_modified(consumer_repr(consumer, show_secret=False), consumer)


class ConsumerResumeView(ConsumerPauseView):
    paused = False

    @extend_schema(summary="Resume a paused consumer (admin): delivery starts again at once",
                   parameters=[ADMIN_PARAM], request=None, responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def post(self, request, channel_id: str, consumer_id: str):
        return super().post(request, channel_id, consumer_id)


REPLAY_REQUEST = {  # what replay_request_parse reads (the schema marks since required: 400 invalid_since without it)
    "type": "object", "required": ["since"],
    "properties": {"since": {"type": "string", "format": "date-time"},
                   "until": {"type": ["string", "null"], "format": "date-time",
                             "description": "default now; not before since"},
                   "onlyFailed": {"type": "boolean", "default": False}},
}


def replay_request_parse(data) -> dict:
    """The replay body: {"since": RFC 3339, "until": optional RFC 3339, "onlyFailed": bool}; 400 otherwise."""
    if not isinstance(data, dict):
        raise InvalidInput("malformed_request", "body must be a JSON object")
    if data.get("since") in (None, ""):
        raise InvalidInput("invalid_since", "since is required (RFC 3339)")
    until = data.get("until")
    only_failed = data.get("onlyFailed", False)
    if not isinstance(only_failed, bool):
        raise InvalidInput("invalid_onlyFailed", "onlyFailed must be true or false")
    return {"since": rfc3339_parse(data["since"], field="since"),
            "until": None if until in (None, "") else rfc3339_parse(until, field="until"),
            "only_failed": only_failed}


class ConsumerReplayView(APIView):
    @extend_schema(
        summary="Replay a window of the channel's messages to this consumer (consumer tokens or admin token)",
        description='JSON {"since": RFC 3339, "until": RFC 3339 (optional, default now), "onlyFailed": bool}. '
                    "Every message of the channel received in [since, until] and still stored gets a fresh QUEUED "
                    "job for this consumer: DELIVERED and DEAD jobs go back to QUEUED (retry count 0), messages "
                    "without a job of this consumer get one; with onlyFailed only DEAD jobs are replayed. Jobs "
                    "QUEUED or INFLIGHT now, and partitioned jobs, are skipped. Works in chunks of 10,000 "
                    'messages. Answers 202 {"Replayed": n, "Skipped": m}; until before since, or a window in the '
                    "future: 400. Recorded as an advisory (replay).",
        parameters=[ADMIN_PARAM, CHANNEL_TOKEN, CONSUMER_TOKEN], request={"application/json": REPLAY_REQUEST},
        responses={202: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 415: ERROR},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        channel = channel_or_404(channel_id)
        consumer = consumer_or_404(channel, consumer_id)
        admin = require_consumer_or_admin(request, channel, consumer)
        window = replay_request_parse(request.data)
        consumer.channel = channel
        result = consumer_replay(consumer=consumer, source="admin-token" if admin else "consumer-token", **window)
        return Response(result.as_json(), status=202)


class ConsumerCircuitCloseView(APIView):
    @extend_schema(summary="Close the consumer's circuit breaker now (admin): delivery resumes at once",
                   parameters=[ADMIN_PARAM], request=None, responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def post(self, request, channel_id: str, consumer_id: str):
        consumer = consumer_for_admin(request, channel_id, consumer_id)
        consumer_circuit_close(consumer=consumer)
        return Response({"Circuit": circuit_state(consumer=consumer)})
