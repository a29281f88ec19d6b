"""HTTP API of inbound sources: the registry (``PUT/GET/DELETE /channel/{c}/source/{s}``,
``GET /channel/{c}/sources``) and the provider-facing ``POST /in/{id}``.

``POST /in/{id}`` is a thin adapter over ``sources.receive.source_request_receive``, which takes
plain values; ``source_receive_answer`` is the same adapter without Django (status, content type,
body, headers), for a front end that serves the route natively. Refusals are domain errors, mapped
here through the one table of ``web.api.errors``.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from prometheus_client.core import CounterMetricFamily
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.durations import duration_format
from broker.errors import DomainError, TooLarge
from broker.registry import Precondition
from broker.times import rfc3339
from sources.models import Source
from sources.receive import source_request_admit, source_request_receive, source_request_too_large
from sources.registry import source_delete, source_of, source_upsert
from sources.rules import FIELDS, RESPONSE_BODY_MAX, SECRET_MAX, dedupe_spec, settings_parse, type_spec
from sources.tallies import (ACCEPTED, CHALLENGE, DUPLICATE, OUTCOMES, REFUSALS_KEPT, source_counts,
                             source_refusals_recent)
from web.api.common import (ADMIN_PARAM, ERROR, LIST, OBJ, PAGE_PARAMS, PRECONDITION, channel_or_404, form_value,
                            public_url, read_body, with_last_modified)
from web.api.errors import status_for
from web.api.pagination import paginate
from web.api.pull.views import JsonOnly
from web.api.put_schemas import put_request
from web.api.representations import changed_at
from web.auth import require_registry

# (no "%" either in the schema: a name is a path segment, and a client that does not percent-encode
# it would send "%20" for what the server then reads as a blank)
NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[^/%\u0000-\u0020\u007f]+$"}
ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[A-Za-z0-9_-]+$"}
CHANNEL = OpenApiParameter("channel_id", {"type": "string", "minLength": 1, "maxLength": 255,
                                          "pattern": r"^[^/\u0000]+$"}, OpenApiParameter.PATH)
NAME = OpenApiParameter("source_name", NAME_SCHEMA, OpenApiParameter.PATH, description="the source's name in its channel")


# --- the representation ------------------------------------------------------------------------------

def source_url(channel_id: str, name: str) -> str:
    return f"/channel/{channel_id}/source/{quote(name, safe='')}"


def source_repr(source: Source, request, *, secret: str | None = None) -> dict:
    """A source as the API shows it; ``secret`` only in the answer of the PUT that set it."""
    body = {
        "ID": source.source_id,
        "Name": source.name,
        "ChannelID": source.channel.channel_id,
        "URL": public_url(request, f"/in/{source.source_id}"),
        "Verify": source.verify,
        "SignatureHeader": source.signature_header,
        "Algorithm": source.algorithm,
        "Encoding": source.encoding,
        "SignaturePrefix": source.signature_prefix,
        "ApiKeyHeader": source.api_key_header,
        "Dedupe": dedupe_spec(source.dedupe, source.verify),
        "DedupeWindow": duration_format(source.dedupe_window),
        "MessageType": type_spec(source.message_type, source.verify),
        "ResponseStatus": source.response_status,
        "ResponseBody": source.response_body,
        "ResponseContentType": source.response_content_type,
        "Enabled": source.enabled,
        "SecretSet": bool(source.secret),
        "PreviousSecretValidUntil": rfc3339(source.previous_expires_at) if source.previous_secret
        and source.previous_expires_at else None,
        "ChangedAt": changed_at(source.updated_at),
    }
    if secret is not None:
        body["Secret"] = secret
    return body


def source_figures(source: Source) -> dict:
    """Counts by outcome (every web process's, written within a second) and the last refusals."""
    counts = source_counts(source_pks=[source.pk]).get(source.pk, {})
    fixed = (ACCEPTED, DUPLICATE, CHALLENGE)
    return {
        "Counts": {**{name: counts.get(name, 0) for name in fixed},
                   "refused": {name: n for name, n in sorted(counts.items()) if name not in fixed and n}},
        "LastRefusals": [{"At": rfc3339(r["at"]), "Reason": r["reason"], "Detail": r["detail"],
                          "Remote": r["remote"]} for r in source_refusals_recent(source_pk=source.pk)],
    }


# --- the registry ----------------------------------------------------------------------------------

_SPEC = r"^(none|body|header:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}|json:[^.\u0000]{1,255}(\.[^.\u0000]{1,255}){0,31})?$"
_TYPE_SPEC = (r"^(none|header:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}|json:[^.\u0000]{1,255}(\.[^.\u0000]{1,255}){0,31}"
              r"|value:[A-Za-z0-9._:/-]{1,128})?$")
_HEADER = {"type": "string", "pattern": r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}$"}
_COMMON = {
    "dedupe": {"type": "string", "pattern": _SPEC, "description": "where the delivery id is: header:NAME, "
               "json:dotted.path, body (a hash of the raw body) or none; empty: the preset's (github "
               "header:X-GitHub-Delivery, stripe json:id, shopify header:X-Shopify-Webhook-Id, slack json:event_id, "
               "standard-webhooks header:webhook-id, others none)"},
    "dedupeWindow": {"description": "how long a delivery id is remembered: 90s, 15m, 12h, 7d or seconds, up to "
                                    "30d (default 72h)",
                     "anyOf": [{"type": "integer", "minimum": 1, "maximum": 30 * 86400},
                               {"type": "string", "pattern": r"^([1-9][0-9]{0,4}[sS]?|[1-9][0-9]{0,3}[mM]|[1-9][0-9]?[hH]"
                                                             r"|[1-6][0-9]{2}[hH]|7[01][0-9][hH]|[1-9][dD]|[12][0-9][dD]"
                                                             r"|30[dD])$"}]},
    "messageType": {"type": "string", "pattern": _TYPE_SPEC, "description": "where the message type is: "
                    "header:NAME, json:dotted.path, value:TYPE or none; empty: the preset's (github "
                    "header:X-GitHub-Event, stripe json:type, shopify header:X-Shopify-Topic, slack json:event.type, "
                    "standard-webhooks json:type, others none)"},
    "responseStatus": {"type": "integer", "minimum": 200, "maximum": 299, "description": "default 200"},
    "responseBody": {"type": "string", "maxLength": RESPONSE_BODY_MAX, "pattern": r"^[^\u0000]*$"},
    "responseContentType": {"type": "string", "maxLength": 255, "pattern": r"^[ -~]*$"},
    "enabled": {"type": "boolean", "description": "false: every request is refused (403 source_disabled)"},
}
_SECRET = {"type": "string", "minLength": 1, "maxLength": SECRET_MAX, "pattern": r"^[^\u0000]+$"}


def _variant(verify: list[str], secret: dict | None, **extra) -> dict:
    properties = {"verify": {"type": "string", "enum": verify}, **_COMMON, **extra}
    if secret is not None:
        properties["secret"] = {**secret, "description": "never shown again after this answer"}
    return {"type": "object", "required": ["verify", *(["secret"] if secret is not None else [])],
            "properties": properties, "additionalProperties": False}


SOURCE_PUT = {"anyOf": [
    _variant(["github", "stripe", "shopify", "slack"], _SECRET),
    _variant(["standard-webhooks"], {"type": "string", "pattern": r"^(whsec_)?([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}"
                                                                  r"(==)?|[A-Za-z0-9+/]{3}=?)$", "minLength": 8}),
    _variant(["basic"], {"type": "string", "maxLength": SECRET_MAX, "pattern": r"^[^\s:\u0000]+:[^\s\u0000]+$"}),
    _variant(["api-key"], _SECRET, apiKeyHeader={**_HEADER, "description": "default X-API-Key"}),
    _variant(["hmac"], _SECRET, signatureHeader=_HEADER,
             algorithm={"type": "string", "enum": ["sha256", "sha512", "sha1"]},
             encoding={"type": "string", "enum": ["hex", "base64"]},
             signaturePrefix={"type": "string", "maxLength": 64, "pattern": r"^[ -~]*$"}),
    _variant(["none"], None),
]}
SOURCE_PUT["anyOf"][4]["required"].append("signatureHeader")

PUT_DESCRIPTION = (
    "Form fields or JSON. verify (required): github, stripe, shopify, slack, standard-webhooks, hmac, basic, "
    "api-key or none; the source verifies exactly so, never otherwise. secret: required unless verify is none "
    "(and again when verify changes); standard-webhooks whsec_<base64>, basic user:password, api-key the key (with "
    "apiKeyHeader, default X-API-Key); shown only in this answer; a new one leaves the previous one verifying for "
    "BROKER_SECRET_ROTATION_GRACE. hmac: signatureHeader (required), algorithm (sha256, sha512, sha1), encoding "
    "(hex, base64), signaturePrefix (e.g. sha256=). dedupe, dedupeWindow, messageType, responseStatus, "
    "responseBody, responseContentType, enabled. A field left out keeps its value. 201 with the source on "
    "creation, 200 on update; URL is the address to give the provider (BROKER_PUBLIC_URL, else this request's "
    "scheme and host). If-Unmodified-Since is optional (412 when the source changed since).")


def _fields(request) -> dict:
    return settings_parse({name: form_value(request, name) for name in FIELDS})


class SourceListView(APIView):
    @extend_schema(summary="List the sources of a channel", parameters=[ADMIN_PARAM, CHANNEL, *PAGE_PARAMS],
                   responses={200: LIST, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        return Response(paginate(request, Source.objects.filter(channel=channel),
                                 path=f"/channel/{channel_id}/sources", item=lambda s: source_url(channel_id, s.name)))


class SourceView(APIView):
    @extend_schema(summary="Get a source", description="Its settings (never its secret), the address to give the "
                   "provider (URL), its Counts by outcome (accepted, duplicate, challenge, refused by reason) and its "
                   f"last {REFUSALS_KEPT} refusals (LastRefusals).",
                   parameters=[ADMIN_PARAM, CHANNEL, NAME], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str, source_name: str):
        require_registry(request)
        source = source_of(channel=channel_or_404(channel_id), name=source_name)
        return with_last_modified({**source_repr(source, request), **source_figures(source)}, source)

    @extend_schema(summary="Create or update an inbound source", description=PUT_DESCRIPTION,
                   parameters=[ADMIN_PARAM, CHANNEL, NAME, PRECONDITION], request=put_request(SOURCE_PUT),
                   responses={200: OBJ, 201: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR,
                              415: ERROR})
    def put(self, request, channel_id: str, source_name: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        fields = _fields(request)
        source, created = source_upsert(channel=channel, name=source_name, fields=fields,
                                        precondition=Precondition(request.headers.get("If-Unmodified-Since")))
        response = with_last_modified(source_repr(source, request, secret=fields.get("secret")), source,
                                      status=201 if created else 200)
        if created:
            response["Location"] = source_url(channel_id, source.name)
        return response

    @extend_schema(summary="Delete a source", description="Its address answers 404 within a second in every web "
                   "process; no request publishes after this answer. If-Unmodified-Since is optional.",
                   parameters=[ADMIN_PARAM, CHANNEL, NAME, PRECONDITION],
                   responses={204: None, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR})
    def delete(self, request, channel_id: str, source_name: str):
        require_registry(request)
        source = source_of(channel=channel_or_404(channel_id), name=source_name)
        source_delete(source=source, precondition=Precondition(request.headers.get("If-Unmodified-Since")))
        return Response(status=204)


class SourceCollector:
    """``broker_source_requests_total{channel,source,outcome}`` on /metrics: every source's requests
    by outcome (accepted, duplicate, challenge, or the refusal's reason), from the maintained
    counters (every web process's tally, written within a second)."""

    def collect(self):
        family = CounterMetricFamily("broker_source_requests", "Requests to inbound sources by outcome (accepted, "
                                     "duplicate, challenge, or the reason of a refusal)",
                                     labels=["channel", "source", "outcome"])
        counts = source_counts()
        for pk, channel_id, name in Source.objects.order_by("channel__channel_id", "name").values_list(
                "pk", "channel__channel_id", "name"):
            per = counts.get(pk, {})
            for outcome in OUTCOMES:
                if outcome in (ACCEPTED, DUPLICATE) or per.get(outcome):
                    family.add_metric([channel_id, name, outcome], per.get(outcome, 0))
        yield family


# --- receiving -------------------------------------------------------------------------------------

def request_headers(meta) -> dict[str, str]:
    """A WSGI request's headers by lower-case name."""
    headers = {key[5:].replace("_", "-").lower(): value for key, value in meta.items() if key.startswith("HTTP_")}
    for key, name in (("CONTENT_TYPE", "content-type"), ("CONTENT_LENGTH", "content-length")):
        if meta.get(key):
            headers[name] = meta[key]
    return headers


def source_receive_answer(*, source_id: str, headers: dict[str, str], body: bytes,
                          remote: str = "") -> tuple[int, str | None, bytes, dict[str, str]]:
    """``POST /in/{id}`` without Django: (status, content type, body, headers), a refusal in the
    API's error shape (``{"error", "detail"}``, Retry-After / WWW-Authenticate when it has one)."""
    try:
        answer = source_request_receive(source_id=source_id, headers=headers, body=body, remote=remote)
    except DomainError as exc:
        extra = dict(exc.headers)
        if getattr(exc, "retry_after", None) is not None:
            extra["Retry-After"] = str(exc.retry_after)
        body = {"error": exc.code, "detail": exc.detail}
        if getattr(exc, "path", None) is not None:  # schema_validation_failed: where in the payload
            body["path"] = exc.path
        return status_for(exc), "application/json", json.dumps(body).encode(), extra
    return answer.status, answer.content_type, answer.body, dict(answer.headers)


class SourceReceiveView(APIView):
    """The address a provider posts to. No broker token (the provider's signature is the
    credential) and exempt from the HMAC gateway by default (BROKER_HMAC_EXEMPT_PATHS)."""

    parser_classes = []  # the body is verified and stored raw, whatever its content type
    authentication_classes = []
    permission_classes = []
    content_negotiation_class = JsonOnly  # whatever a provider's Accept says (Stripe's names application/xml)

    @extend_schema(
        summary="Receive a provider's webhook (inbound source)",
        description="Verified as the source's verify says (GitHub X-Hub-Signature-256; Stripe Stripe-Signature; "
                    "Shopify X-Shopify-Hmac-Sha256; Slack X-Slack-Signature with X-Slack-Request-Timestamp; "
                    "Standard Webhooks webhook-id, webhook-timestamp, webhook-signature; hmac, basic, api-key as "
                    "configured), then published to its channel as one message (the body byte for byte, its "
                    "Content-Type, the type its messageType reads, X-Broker-Source and X-Broker-Source-Delivery) "
                    "and answered with its responseStatus / responseBody once committed. A redelivery within the "
                    "dedupe window answers the same and publishes nothing; a verified Slack url_verification "
                    'answers {"challenge": ...}. 401 signature_missing, signature_invalid or '
                    "timestamp_out_of_tolerance; 403 source_disabled; 404 unknown id; 413 over "
                    "BROKER_MAX_PAYLOAD_BYTES; 422 when the event breaks the channel's event types (as a "
                    "publish); nothing is stored for any of them.",
        parameters=[OpenApiParameter("source_id", ID_SCHEMA, OpenApiParameter.PATH,
                                     description="the source's URL id"),
                    OpenApiParameter("traceparent", OpenApiTypes.STR, OpenApiParameter.HEADER,
                                     description="W3C trace context, continued into the message")],
        request={"application/octet-stream": {"type": "string", "format": "binary"},
                 "*/*": {"type": "string", "format": "binary"}},
        responses={(200, "*/*"): OpenApiResponse(description="accepted (or a redelivery): the source's "
                                                             "responseStatus (200-299) and responseBody"),
                   400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 413: ERROR, 422: ERROR, 429: ERROR},
    )
    def post(self, request, source_id: str):
        remote = request.META.get("REMOTE_ADDR", "")
        try:
            body = read_body(request, settings.BROKER_MAX_PAYLOAD_BYTES,  # (an unknown id: 404 before reading)
                             credentials_check=lambda: source_request_admit(source_id=source_id, remote=remote))
        except TooLarge:
            raise source_request_too_large(source_id=source_id, remote=remote) from None
        answer = source_request_receive(source_id=source_id, headers=request_headers(request.META), body=body,
                                        remote=remote)
        response = HttpResponse(answer.body, status=answer.status)
        if answer.content_type:
            response["Content-Type"] = answer.content_type
        else:
            del response["Content-Type"]
        for name, value in answer.headers.items():
            response[name] = value
        return response

