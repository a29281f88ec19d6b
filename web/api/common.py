"""What every API view shares: the OpenAPI parameters and answers, form fields, Last-Modified,
the channel lookup and its readers' check, and the size-checked raw body.

Views translate HTTP to service calls and back; they hold no business logic.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.response import Response

from broker.errors import Forbidden, InvalidInput, NotFound, TooLarge, Unauthenticated
from broker.models import Channel
from broker.tokens import tokens_equal
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
    given = request.headers.get("X-Broker-Channel-Token")
    if given is None:
        raise Unauthenticated("unauthorized", "X-Broker-Channel-Token or X-Broker-Admin-Token is required")
    if not tokens_equal(given, channel.token):
        raise Forbidden("forbidden", "channel token does not match")


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
