"""What every API view shares: the OpenAPI parameters and answers, form fields, Last-Modified,
the channel lookup and its readers' check, and the size-checked raw body.

Views translate HTTP to service calls and back; they hold no business logic.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.response import Response

from broker.errors import InvalidInput, NotFound, TooLarge
from broker.models import Channel
from broker.numbers import whole, whole_text
from broker.tokens import token_require
from web.api.errors import ERROR_RESPONSE
from web.api.pagination import CURSOR_MAX_LENGTH, CURSOR_PATTERN
from web.api.representations import last_modified
from web.auth import ADMIN_HEADER, is_admin


ERROR = ERROR_RESPONSE  # the JSON error body (component "Error")
ADMIN_PARAM = OpenApiParameter(ADMIN_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
                               description="BROKER_ADMIN_TOKEN (or a staff session)")
CHANNEL_TOKEN = OpenApiParameter("X-Broker-Channel-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
CONSUMER_TOKEN = OpenApiParameter("X-Broker-Consumer-Token", OpenApiTypes.STR, OpenApiParameter.HEADER)
# An HTTP date as Last-Modified gives it (IMF-fixdate, RFC 9110), limited to dates that exist (Django's
# parse_http_date_safe, which broker.registry.Precondition reads, refuses 30 Feb): else 400 invalid_precondition.
_MONTHS_30 = "Jan|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
HTTP_DATE = {"type": "string", "pattern": (
    r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?:(?:(?:0[1-9]|1[0-9]|2[0-8]) (?:Feb|" + _MONTHS_30 + ")"
    r"|(?:29|30) (?:" + _MONTHS_30 + ")|31 (?:Jan|Mar|May|Jul|Aug|Oct|Dec))"
    r" (?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])|29 Feb " + _LEAP_YEAR + ")"
    r" (?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9] GMT$"),
    "example": "Tue, 03 Mar 2026 10:15:00 GMT"}
PRECONDITION = OpenApiParameter("If-Unmodified-Since", HTTP_DATE, OpenApiParameter.HEADER,
                                description="required for an update (400 precondition_required without it): the "
                                            "object's Last-Modified; 412 when the object changed since")
# a delete is always of an existing object: the header is required (400 precondition_required without it)
PRECONDITION_REQUIRED = OpenApiParameter("If-Unmodified-Since", HTTP_DATE, OpenApiParameter.HEADER,
                                         required=True, description="the object's Last-Modified (HTTP date); 412 "
                                                                    "when the object changed since")
# the cursors of a list's Pages (web.api.pagination); one of the two (both: 400 invalid_cursor)
CURSOR = {"type": "string", "pattern": CURSOR_PATTERN, "maxLength": CURSOR_MAX_LENGTH}
PAGE_PARAMS = [OpenApiParameter("next", CURSOR, description="Pages.next of the previous answer"),
               OpenApiParameter("previous", CURSOR, description="Pages.previous of the previous answer "
                                                                "(not with next)")]
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
    return str(whole(value))  # a JSON 2.0 reads as "2": an integer (JSON Schema 2020-12, OpenAPI 3.1)


def form_number(request, name: str, cast, in_range, *, range_text: str = "is out of range"):
    """A numeric form field (``cast``: int or float) for which ``in_range`` holds; None when absent
    or empty; anything else is a 400 ``invalid_<name>``."""
    raw = form_value(request, name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = cast(whole_text(raw) if cast is int else raw)  # "5.0": the integer 5 (JSON Schema 2020-12)
    except ValueError:
        raise InvalidInput(f"invalid_{name}", f"{name} must be {'an integer' if cast is int else 'a number'}") from None
    if not in_range(value):
        raise InvalidInput(f"invalid_{name}", f"{name} {range_text}")
    return value


def statuses_param_schema(choices, description: str = "") -> OpenApiParameter:
    """The OpenAPI ``status`` parameter that ``statuses_param`` reads: names or numbers of
    ``choices``, comma-separated (or repeated)."""
    values = [*choices.names, *(str(v) for v in choices.values)]
    return OpenApiParameter("status", {"type": "array", "items": {"type": "string", "enum": values}},
                            explode=False, description=description or f"{', '.join(choices.names)} (or their "
                                                                      "numbers), comma-separated")


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


def public_url(request, path: str) -> str:
    """``path`` on the broker's public address (BROKER_PUBLIC_URL, or its earlier name
    BROKER_PORTAL_URL: the portal's links and the inbound sources' addresses), else on the scheme
    and host this request came to."""
    base = settings.BROKER_PUBLIC_URL or settings.BROKER_PORTAL_URL
    return f"{base}{path}" if base else request.build_absolute_uri(path)


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


# A body up to this is read before the credentials are checked (it came with the head); a larger one
# only once they passed (``read_body``'s ``credentials_check``): an anonymous client cannot make the
# broker read megabytes.
BODY_PREREAD = 64 * 1024


def read_body(request, limit: int, *, credentials_check=None) -> bytes:
    """The raw body, refusing (413) before reading when Content-Length says it is too large; a body
    larger than ``BODY_PREREAD`` is read only after ``credentials_check()`` (raising their refusal)."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InvalidInput("malformed_request", "invalid Content-Length") from None
    if declared > limit:
        raise TooLarge("payload_too_large", f"body is larger than {limit} bytes")
    if credentials_check is not None and declared > BODY_PREREAD:
        credentials_check()
    body = request.body
    if len(body) > limit:
        raise TooLarge("payload_too_large", f"body is larger than {limit} bytes")
    return body
