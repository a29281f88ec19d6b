"""HTTP API for the registry's producers and channels (webhook-broker compatible PUT upserts)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import InvalidInput, NotFound
from broker.message_types import ttl_parse
from broker.models import Channel, Producer
from broker.registry import Precondition, channel_upsert, producer_upsert
from web.api.common import (
    ADMIN_PARAM, ERROR, LIST, OBJ, PAGE_PARAMS, PRECONDITION, channel_or_404, form_value, with_last_modified,
)
from web.api.pagination import paginate
from web.api.representations import channel_repr, producer_repr
from web.auth import require_registry


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
        description="Form fields (or JSON): token, name, messageTTL (seconds 1..31536000: default TTL of its "
                    "messages; 'none' clears it). Update needs If-Unmodified-Since.",
        parameters=[ADMIN_PARAM, PRECONDITION], request=OpenApiTypes.OBJECT,
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 412: ERROR, 415: ERROR},
    )
    def put(self, request, channel_id: str):
        require_registry(request)
        channel, _created = channel_upsert(
            channel_id=channel_id, name=form_value(request, "name"), token=form_value(request, "token"),
            precondition=Precondition(request.headers.get("If-Unmodified-Since")),
            settings=channel_settings_parse(request),
        )
        return with_last_modified(channel_repr(channel), channel)


def channel_settings_parse(request) -> dict:
    """Expiry field of the channel PUT: messageTTL (seconds; 'none' clears it; absent: unchanged)."""
    raw = form_value(request, "messageTTL")
    if raw is None:
        return {}
    if isinstance(raw, str) and raw.strip().lower() in ("none", "null"):
        return {"message_ttl": None}
    return {"message_ttl": ttl_parse(raw, field="messageTTL")} if str(raw).strip() else {}  # 200 on create too, as webhook-broker
