"""HTTP API for a consumer's partitions (jobs.partitions): list, read, close, advance, retry, skip
and set the flags. Consumer tokens (channel + consumer) or the admin token, like the other
consumer routes; 404 for an unknown channel, consumer or key. Keys are path segments: encode
what a URL cannot hold as-is (``%2F`` for ``/`` works too).
"""

from __future__ import annotations

from urllib.parse import quote

from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import InvalidInput
from jobs.models import Partition, PartitionStatus
from jobs.ops.partition_actions import (partition_advance, partition_close, partition_retry, partition_skip,
                                        partition_update)
from jobs.partitions.rows import partition_get
from web.api.common import ADMIN_PARAM, CHANNEL_TOKEN, ERROR, PAGE_PARAMS, channel_or_404
from web.api.consumers import consumer_or_404, require_consumer_or_admin
from web.api.pagination import paginate
from web.api.put_schemas import put_request

CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
AUTH = [CHANNEL_TOKEN, CONSUMER_TOKEN, ADMIN_PARAM]
ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR}
PARTITION = OpenApiResponse(OpenApiTypes.OBJECT, description=(
    '{"key", "consumer", "channel", "gate", "status": AVAILABLE|FAILED|COMPLETE, "closed", "autoClose", '
    '"manualCheckpoint", "owner", "leaseUntil", "leased", "version", "createdAt", "updatedAt", '
    '"counts": {"<gate>": {"QUEUED": n, ...}}, "totals": {...}}'))


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_FLAG = {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": [*_TRUE, *_FALSE]}]}  # what _bool reads
FLAGS_REQUEST = {"type": "object", "properties": {"autoClose": _FLAG, "manualCheckpoint": _FLAG}}


def _consumer(request, channel_id: str, consumer_id: str):
    channel = channel_or_404(channel_id)
    consumer = consumer_or_404(channel, consumer_id)
    require_consumer_or_admin(request, channel, consumer)
    return consumer


def _bool(value, name: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidInput(f"invalid_{name}", f"{name} must be true or false")


class PartitionListView(APIView):
    @extend_schema(
        summary="List a consumer's partitions (newest first, 25 per page)",
        parameters=[*AUTH, OpenApiParameter("status", {"type": "string", "enum": list(PartitionStatus.names)},
                                            description="AVAILABLE, FAILED or COMPLETE"), *PAGE_PARAMS],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description='{"Result": [partition], "Pages": {...}}'),
                   **ERRORS},
    )
    def get(self, request, channel_id: str, consumer_id: str):
        consumer = _consumer(request, channel_id, consumer_id)
        qs = Partition.objects.filter(consumer=consumer)
        status = request.query_params.get("status")
        if status:
            name = status.strip().upper()
            if name not in PartitionStatus.names:
                raise InvalidInput("invalid_status", "status must be AVAILABLE, FAILED or COMPLETE")
            qs = qs.filter(status=PartitionStatus[name].value)
        base = f"/channel/{quote(channel_id, safe='-_.~')}/consumer/{quote(consumer_id, safe='-_.~')}"

        def item(p: Partition) -> dict:
            return {"key": p.key, "gate": p.gate, "status": PartitionStatus(p.status).name, "closed": p.closed,
                    "autoClose": p.auto_close, "manualCheckpoint": p.manual_checkpoint, "owner": p.owner or None,
                    "version": p.version,
                    "url": f"{base}/partition/{quote(p.key, safe='-_.~')}"}

        return Response(paginate(request, qs, path=f"{base}/partitions", item=item, keep_params=("status",)))


class PartitionView(APIView):
    parser_classes = [JSONParser, FormParser, MultiPartParser]

    @extend_schema(summary="A partition: gate, status, lease, version and job counts per gate and status",
                   parameters=AUTH, responses={200: PARTITION, **ERRORS})
    def get(self, request, channel_id: str, consumer_id: str, key: str):
        consumer = _consumer(request, channel_id, consumer_id)
        return Response(partition_get(consumer_pk=consumer.pk, key=key))

    @extend_schema(
        summary="Set a partition's autoClose / manualCheckpoint flags",
        description='JSON or form: {"autoClose": bool, "manualCheckpoint": bool} (either or both). autoClose: '
                    "COMPLETE as soon as all its jobs are delivered; manualCheckpoint: gates advance only "
                    "through .../advance.",
        parameters=AUTH, request=put_request(FLAGS_REQUEST), responses={200: PARTITION, **ERRORS},
    )
    def patch(self, request, channel_id: str, consumer_id: str, key: str):
        consumer = _consumer(request, channel_id, consumer_id)
        data = request.data if hasattr(request.data, "get") else {}
        auto_close = _bool(data.get("autoClose"), "autoClose")
        manual = _bool(data.get("manualCheckpoint"), "manualCheckpoint")
        return Response(partition_update(consumer_pk=consumer.pk, key=key,
                                                    auto_close=auto_close, manual_checkpoint=manual))



def _action_view(name: str, fn, summary: str, description: str):
    class View(APIView):
        parser_classes = [JSONParser, FormParser, MultiPartParser]

        @extend_schema(summary=summary, description=description, parameters=AUTH, request=None,
                       responses={200: PARTITION, **ERRORS}, operation_id=f"partition_{name}")
        def post(self, request, channel_id: str, consumer_id: str, key: str):
            consumer = _consumer(request, channel_id, consumer_id)
            return Response(fn(consumer_pk=consumer.pk, key=key))

    View.__name__ = View.__qualname__ = f"Partition{name.title()}View"
    return View


PartitionCloseView = _action_view(
    "close", partition_close, "Close a partition (no more items)",
    "The partition completes (advisory partition_complete) once all its jobs are delivered; publishing to "
    "its key is refused with 409 partition_closed from now on.")
PartitionAdvanceView = _action_view(
    "advance", partition_advance, "Advance a partition to its next gate (manual checkpoint)",
    "Only when every job at the current gate is delivered; 409 gate_not_finished, no_next_gate, "
    "partition_not_available otherwise.")
PartitionRetryView = _action_view(
    "retry", partition_retry, "Requeue a partition's dead jobs",
    "DEAD jobs go back to QUEUED with the retry count reset; the partition is AVAILABLE again. Answers the "
    "partition plus requeued.")
PartitionSkipView = _action_view(
    "skip", partition_skip, "Skip the dead jobs at a partition's current gate",
    "The DEAD jobs at the current gate are deleted (like the DLQ delete; their history stays), so the gate "
    "counts as finished and the partition moves on. Answers the partition plus skipped.")


def _slash_key(view):
    """The same view for a key with "/" in it (a plain function, so the schema lists the route once)."""
    @csrf_exempt
    def dispatch(request, **kwargs):
        return view(request, **kwargs)

    return dispatch


def key_routes(prefix: str) -> list:
    views = [("/close", PartitionCloseView), ("/advance", PartitionAdvanceView), ("/retry", PartitionRetryView),
             ("/skip", PartitionSkipView), ("", PartitionView)]
    routes = [path(f"{prefix}/partition/<str:key>{suffix}", cls.as_view()) for suffix, cls in views]
    routes += [path(f"{prefix}/partition/<path:key>{suffix}", _slash_key(cls.as_view())) for suffix, cls in views]
    return routes
