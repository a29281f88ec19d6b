"""HTTP API for the registry's producers and channels (webhook-broker compatible PUT upserts)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.durations import retention_parse
from broker.errors import NotFound
from broker.message_types import ttl_parse
from broker.models import Channel, Producer
from broker.registry import Precondition, channel_upsert, producer_upsert
from eventtypes.rules import mode_parse
from eventtypes.validation import rules_changed
from jobs.sweeps.retention import channel_footprint
from web.api.common import (ADMIN_PARAM, ERROR, LIST, OBJ, PAGE_PARAMS, PRECONDITION, channel_or_404, form_number,
                            form_value, with_last_modified)
from web.api.pagination import paginate
from web.api.put_schemas import CHANNEL_PUT, PRODUCER_PUT, put_request
from web.api.representations import channel_repr, producer_repr
from web.auth import require_registry

# The OpenAPI description of the three kinds of registry request (producers and channels alike).
LIST_SCHEMA = {"parameters": [ADMIN_PARAM, *PAGE_PARAMS], "responses": {200: LIST, 400: ERROR, 401: ERROR, 403: ERROR}}
GET_SCHEMA = {"parameters": [ADMIN_PARAM], "responses": {200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR}}
PUT_SCHEMA = {"parameters": [ADMIN_PARAM, PRECONDITION],
              "responses": {200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 412: ERROR, 415: ERROR}}


def registry_list(request, queryset, *, kind: str, key: str) -> Response:
    """One page of ``/{kind}s``: the objects' relative URLs, newest first."""
    require_registry(request)
    return Response(paginate(request, queryset, path=f"/{kind}s", item=lambda o: f"/{kind}/{getattr(o, key)}"))


def registry_put(request, upsert, represent, **fields) -> Response:
    """Create or update through ``upsert`` (the service checks If-Unmodified-Since); 200 on create
    too, as webhook-broker."""
    require_registry(request)
    obj, _created = upsert(name=form_value(request, "name"), token=form_value(request, "token"),
                           precondition=Precondition(request.headers.get("If-Unmodified-Since")), **fields)
    return with_last_modified(represent(obj), obj)


# --- producers ------------------------------------------------------------------------------------

class ProducerListView(APIView):
    @extend_schema(summary="List producers", **LIST_SCHEMA)
    def get(self, request):
        return registry_list(request, Producer.objects.all(), kind="producer", key="producer_id")


class ProducerView(APIView):
    @extend_schema(summary="Get a producer", **GET_SCHEMA)
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
        request=put_request(PRODUCER_PUT), **PUT_SCHEMA,
    )
    def put(self, request, producer_id: str):
        require_registry(request)  # the credentials before the body is read
        return registry_put(request, producer_upsert, producer_repr, producer_id=producer_id,
                            rate=producer_rate_parse(request))


def producer_rate_parse(request) -> dict:
    """Flow control fields of the producer PUT: rateLimitPerSecond (0 clears it) and burst."""
    fields: dict = {}
    rate = form_number(request, "rateLimitPerSecond", float, lambda v: 0 <= v < 1e9)
    if rate is not None:
        fields["rate_limit_per_second"] = rate or None
    burst = form_number(request, "burst", int, lambda v: 1 <= v <= 2**31 - 1)
    if burst is not None:
        fields["burst"] = burst
    return fields


# --- channels -------------------------------------------------------------------------------------

class ChannelListView(APIView):
    @extend_schema(summary="List channels", **LIST_SCHEMA)
    def get(self, request):
        return registry_list(request, Channel.objects.all(), kind="channel", key="channel_id")


class ChannelView(APIView):
    @extend_schema(summary="Get a channel", description="With its Footprint: the retention in force, the oldest "
                   "stored message, the rows retention removed and when the retention sweep last ran.", **GET_SCHEMA)
    def get(self, request, channel_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        body = channel_repr(channel)
        body["Footprint"] = channel_footprint(channel=channel)
        return with_last_modified(body, channel)

    @extend_schema(
        summary="Create or update a channel",
        description="Form fields (or JSON): token, name, messageTTL (seconds 1..31536000: default TTL of its "
                    "messages; 'none' clears it), retention (how long a message whose jobs are all finished "
                    "stays stored: a duration such as 90s, 15m, 12h, 7d or seconds, 1s..3650d; empty or 'none': "
                    "BROKER_RETENTION), eventTypes (open: a message type without an event type passes, "
                    "closed: 422 unknown_event_type). Update needs If-Unmodified-Since.",
        request=put_request(CHANNEL_PUT), **PUT_SCHEMA,
    )
    def put(self, request, channel_id: str):
        require_registry(request)  # the credentials before the body is read
        settings = channel_settings_parse(request)
        response = registry_put(request, channel_upsert, channel_repr, channel_id=channel_id, settings=settings)
        if "event_types" in settings:
            rules_changed()  # this process's next publish sees the channel's eventTypes at once
        return response


def channel_settings_parse(request) -> dict:
    """Fields of the channel PUT: messageTTL (expiry: seconds; 'none' clears it; absent: unchanged),
    retention (a duration; empty or 'none' clears it: BROKER_RETENTION applies; absent: unchanged) and
    eventTypes (open or closed; absent or empty: unchanged)."""
    fields: dict = {}
    mode = mode_parse(form_value(request, "eventTypes"))  # issue 37: open or closed
    if mode is not None:
        fields["event_types"] = mode
    retention = form_value(request, "retention")
    if retention is not None:
        fields["retention"] = retention_parse(retention)
    raw = form_value(request, "messageTTL")
    if raw is None:
        return fields
    if isinstance(raw, str) and raw.strip().lower() in ("none", "null"):
        return {**fields, "message_ttl": None}
    return {**fields, "message_ttl": ttl_parse(raw, field="messageTTL")} if str(raw).strip() else fields
