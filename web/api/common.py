"""What every API view shares: the OpenAPI parameters and answers, form fields, Last-Modified,
the channel lookup and its readers' check, and the size-checked raw body.

Views translate HTTP to service calls and back; they hold no business logic.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.response import Response

from broker.errors import InvalidInput, NotFound, TooLarge
from broker.models import Channel
from broker.tokens import token_require
from web.api.errors import ERROR_RESPONSE
from web.api.representations import last_modified
from web.auth import ADMIN_HEADER, is_admin


ERROR = ERROR_RESPONSE  # the JSON error body (component "Error")
ADMIN_PARAM = OpenApiParameter(ADMIN_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
                               description="BROKER_ADMIN_TOKEN (or a staff session)")
CHANNEL_TOKEN = OpenApiParameter("X-Broker-Channel-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
PRECONDITION = OpenApiParameter("If-Unmodified-Since", OpenApiTypes.STR, OpenApiParameter.HEADER,
                                description="required for an update: the object's Last-Modified")
# a delete is always of an existing object: the header is required (400 precondition_required without it)
PRECONDITION_REQUIRED = OpenApiParameter("If-Unmodified-Since", OpenApiTypes.STR, OpenApiParameter.HEADER,
                                         required=True, description="the object's Last-Modified (HTTP date)")
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


def form_number(request, name: str, cast, in_range, *, range_text: str = "is out of range"):
    """A numeric form field (``cast``: int or float) for which ``in_range`` holds; None when absent
    or empty; anything else is a 400 ``invalid_<name>``."""
    raw = form_value(request, name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = cast(raw)
    except ValueError:
        raise InvalidInput(f"invalid_{name}", f"{name} must be {'an integer' if cast is int else 'a number'}") from None
    if not in_range(value):
        raise InvalidInput(f"invalid_{name}", f"{name} {range_text}")
    return value


def statuses_param(request, choices) -> list[int]:
    """The ``status`` query parameters (repeated or comma-separated; names or numbers of
    ``choices``, an IntegerChoices) as their values; anything else is a 400."""
    result = []
    for raw in request.query_params.getlist("status"):
        for part in raw.split(","):
            part = part.strip().upper()
            if not part:
                continue
            if part.isdigit() and int(part) in choices.values:
                result.append(int(part))
            elif part in choices.names:
                result.append(choices[part].value)
            else:
                raise InvalidInput("invalid_status", f"status must be {'/'.join(choices.names)} "
                                                     f"(or {'/'.join(str(v) for v in choices.values)})")
    return result


def channel_rows_by_status(request, channel_id: str, model):
    """A channel's rows of ``model`` (Message or ScheduledMessage: both listed by id and message id)
    for a channel reader, narrowed to the ``status`` query parameters when there are any."""
    channel = channel_or_404(channel_id)
    require_channel_reader(request, channel)
    qs = model.objects.filter(channel=channel).only("id", "message_id")
    statuses = statuses_param(request, model.Status)
    if statuses:
        qs = qs.filter(status__in=statuses)
    return qs


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
    token_require(request.headers.get("X-Broker-Channel-Token"), channel.token,
                  header="X-Broker-Channel-Token or X-Broker-Admin-Token", code="forbidden",
                  detail="channel token does not match")


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
