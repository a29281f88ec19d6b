"""HTTP API for a channel's event types (issue 37): create or change one (PUT, admin token or staff;
form fields or JSON), read it with every version of its schema, list and delete them, import them
from an OpenAPI document's webhooks, and the channel's AsyncAPI document. ``schema_webhooks`` puts
every channel's event types into the OpenAPI schema's ``webhooks`` (a postprocessing hook).

The rules and the writes are ``eventtypes``'; validation at publish is ``eventtypes.validation``."""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

import yaml
from django.db import transaction
from django.http import JsonResponse, QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import InvalidInput
from broker.models import Channel
from eventtypes.documents import TypeDoc, asyncapi_document, openapi_webhook, webhook_schema_name
from eventtypes.openapi_import import openapi_webhooks_parse
from eventtypes.rules import deprecated_parse, description_parse, example_parse, schema_parse
from eventtypes.services import (UNSET, EventTypeChange, event_type_delete, event_type_get, event_type_upsert,
                                 event_types_list, schema_current, unmodified_since_epoch, versions_all)
from web.api.common import (ADMIN_PARAM, CHANNEL_TOKEN, ERROR, HTTP_DATE, OBJ, channel_or_404, read_body,
                            require_channel_reader, with_last_modified)
from web.api.representations import changed_at, rfc3339
from web.auth import require_registry

logger = logging.getLogger("web.api.event_types")
IMPORT_MAX_BYTES = 8 * 1024 * 1024
EVENT_TYPE_PARAM = OpenApiParameter("event_type", {"type": "string", "pattern": r"^[A-Za-z0-9._:/-]{1,128}$"},
                                    OpenApiParameter.PATH, description="the event type: a message type (1-128 "
                                                                       "characters of A-Z a-z 0-9 . _ : / -)")
PRECONDITION_OPTIONAL = OpenApiParameter("If-Unmodified-Since", HTTP_DATE, OpenApiParameter.HEADER,
                                         description="optional: the event type's Last-Modified; 412 when it "
                                                     "changed since")
_SCHEMA_FIELD = {"description": "a JSON Schema (draft 2020-12): an object, or a string holding one; empty or null: "
                                "no schema (any payload). A change makes a new version",
                 "anyOf": [{"type": "object"}, {"type": "string", "maxLength": 262144}, {"type": "null"}]}
_FIELDS = {
    "description": {"type": "string", "maxLength": 4096, "pattern": r"^[^\u0000]*$"},
    "example": {"description": "an example payload: must validate against the schema (400 invalid_example); null "
                               "or empty: none"},
    "deprecated": {"anyOf": [{"type": "boolean"},
                             {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off", ""]}]},
}
EVENT_TYPE_PUT = {"type": "object", "properties": {"schema": _SCHEMA_FIELD, **_FIELDS}}
EVENT_TYPE_PUT_FORM = {"type": "object", "properties": {
    "schema": {"type": "string", "maxLength": 262144, "description": "the JSON Schema as JSON text; empty: no schema"},
    **_FIELDS, "example": {"type": "string", "description": "the example as JSON text; empty: none"}}}


def event_type_url(channel_id: str, name: str) -> str:
    return f"/channel/{channel_id}/event-type/{quote(name, safe='/:._-')}"


def event_type_repr(event_type, channel_id: str, *, versions: bool = True) -> dict:
    """An event type as the API, the catalog and the documents show it."""
    body = {
        "ID": event_type.name,
        "Type": event_type.name,
        "ChannelID": channel_id,
        "Description": event_type.description,
        "Schema": schema_current(event_type),
        "Example": event_type.example,
        "Deprecated": event_type.deprecated,
        "Version": event_type.version,
        "CreatedAt": rfc3339(event_type.created_at),
        "ChangedAt": changed_at(event_type.updated_at),
        "URL": event_type_url(channel_id, event_type.name),
    }
    if versions:
        body["Versions"] = [{"Version": v.version, "Schema": v.schema, "CreatedAt": rfc3339(v.created_at)}
                            for v in versions_all(event_type)]
    return body


def type_doc(event_type) -> TypeDoc:
    return TypeDoc(name=event_type.name, description=event_type.description, schema=schema_current(event_type),
                   example=event_type.example, deprecated=event_type.deprecated, version=event_type.version)


def event_type_change(request) -> EventTypeChange:
    """The PUT's fields: JSON (schema an object or a string holding one, example any JSON value) or
    form fields (schema and example as JSON text)."""
    data = request.data
    if not hasattr(data, "get"):
        raise InvalidInput("malformed_request", "body must be form fields or a JSON object")
    form = isinstance(data, QueryDict)
    return EventTypeChange(
        schema=schema_parse(data.get("schema"), text=form) if "schema" in data else UNSET,
        description=description_parse(data.get("description")),
        example=example_parse(data.get("example"), text=form) if "example" in data else UNSET,
        deprecated=deprecated_parse(data.get("deprecated")),
    )


class EventTypeListView(APIView):
    @extend_schema(summary="List a channel's event types",
                   description="Each with its current schema and version, by name; and the channel's eventTypes "
                               "(open or closed). The channel token or the admin token.",
                   parameters=[CHANNEL_TOKEN, ADMIN_PARAM], responses={200: OBJ, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        return Response({"EventTypes": channel.event_types,
                         "Result": [event_type_repr(t, channel_id, versions=False)
                                    for t in event_types_list(channel_pks=[channel.pk])],
                         "Pages": {}})


class EventTypeView(APIView):
    @extend_schema(summary="Get an event type with every version of its schema",
                   parameters=[EVENT_TYPE_PARAM, CHANNEL_TOKEN, ADMIN_PARAM],
                   responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str, event_type: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        found = event_type_get(channel=channel, name=event_type)
        return with_last_modified(event_type_repr(found, channel_id), found)

    @extend_schema(
        summary="Create or update an event type",
        description="Form fields or JSON: schema (JSON Schema draft 2020-12; 400 invalid_schema with the reason), "
                    "description, example (must validate: 400 invalid_example), deprecated. A changed schema is a "
                    "new Version; the answer and GET show Version and Versions. A field left out is unchanged; "
                    "a new schema that the kept example does not fit drops the example. Publishes of this type on "
                    "the channel are validated against the current version within a second.",
        parameters=[EVENT_TYPE_PARAM, ADMIN_PARAM, PRECONDITION_OPTIONAL],
        request={"application/json": EVENT_TYPE_PUT, "application/x-www-form-urlencoded": EVENT_TYPE_PUT_FORM,
                 "multipart/form-data": EVENT_TYPE_PUT_FORM},
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 412: ERROR, 415: ERROR},
    )
    def put(self, request, channel_id: str, event_type: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        result = event_type_upsert(channel=channel, name=event_type, change=event_type_change(request),
                                   unmodified_since=unmodified_since_epoch(request.headers.get("If-Unmodified-Since")))
        found = event_type_get(channel=channel, name=result.event_type.name)
        body = event_type_repr(found, channel_id)
        if result.dropped_example:
            body["Warnings"] = ["the example no longer validated against the new schema and was dropped"]
        return with_last_modified(body, found)

    @extend_schema(summary="Delete an event type and all its versions",
                   description="204. Messages of this type are then validated as the channel's eventTypes says.",
                   parameters=[EVENT_TYPE_PARAM, ADMIN_PARAM, PRECONDITION_OPTIONAL],
                   responses={204: None, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 412: ERROR})
    def delete(self, request, channel_id: str, event_type: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        event_type_delete(channel=channel, name=event_type,
                          unmodified_since=unmodified_since_epoch(request.headers.get("If-Unmodified-Since")))
        return Response(status=204)


def import_document(request) -> dict:
    """The uploaded OpenAPI document: JSON, or YAML when the content type says so."""
    raw = read_body(request, IMPORT_MAX_BYTES)
    media = (request.content_type or "").split(";", 1)[0].strip().lower()
    try:
        if media in ("application/yaml", "application/x-yaml", "text/yaml", "application/vnd.oai.openapi"):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError, yaml.YAMLError):
        raise InvalidInput("invalid_document", "the body is not a JSON (or, with a YAML content type, YAML) "
                                               "document") from None


DRY_RUN = OpenApiParameter("dryRun", {"type": "string", "enum": ["true", "false", "1", "0", ""]},
                           description="true: answer what would change, change nothing")
_DOCUMENT = {"type": "object", "required": ["openapi"], "description": "an OpenAPI 3.1 document with webhooks (or "
             "3.0 with x-webhooks)", "properties": {"openapi": {"type": "string"}}}


class EventTypeImportView(APIView):
    parser_classes = []  # the document is read raw (JSON or YAML)

    @extend_schema(
        summary="Import event types from an OpenAPI document's webhooks",
        description="An OpenAPI 3.1 document (webhooks) or 3.0 one (x-webhooks), JSON or YAML: each webhook's "
                    "POST becomes an event type named by its key (or its x-event-type), with the JSON request "
                    "body's schema (component $refs bundled under $defs) and example, its description and "
                    "deprecated; existing types are updated (a changed schema is a new version). All or "
                    "nothing: 400 invalid_schema names a webhook whose schema is not valid. dryRun=true answers "
                    "what would change and changes nothing.",
        parameters=[ADMIN_PARAM, DRY_RUN],
        request={"application/json": _DOCUMENT},
        responses={200: OBJ, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 413: ERROR},
    )
    def post(self, request, channel_id: str):
        require_registry(request)
        channel = channel_or_404(channel_id)
        dry_run = bool(deprecated_parse(request.query_params.get("dryRun")))
        plan = openapi_webhooks_parse(import_document(request))
        results = []
        with transaction.atomic():
            for imported in plan.types:
                change = EventTypeChange(schema=imported.schema, description=imported.description or None,
                                         example=UNSET if imported.example is None else imported.example,
                                         deprecated=imported.deprecated)
                upserted = event_type_upsert(channel=channel, name=imported.name, change=change)
                results.append({"Type": imported.name, "Action": upserted.action, "Version": upserted.event_type.version,
                                "URL": event_type_url(channel_id, imported.name)})
            if dry_run:
                transaction.set_rollback(True)  # every change undone: the answer is what would be
        counts = {action: sum(1 for r in results if r["Action"] == action) for action in ("created", "updated",
                                                                                           "unchanged")}
        return Response({"DryRun": dry_run, "Created": counts["created"], "Updated": counts["updated"],
                         "Unchanged": counts["unchanged"], "Result": results, "Skipped": plan.skipped,
                         "Warnings": plan.warnings})


class AsyncApiView(APIView):
    @extend_schema(summary="The channel's AsyncAPI 3.0 document",
                   description="Its event types as messages with their payload schemas and examples; publishing, "
                               "push delivery and pull as operations; the tokens and the webhook signature as "
                               "security schemes. The channel token or the admin token.",
                   parameters=[CHANNEL_TOKEN, ADMIN_PARAM],
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="AsyncAPI 3.0 document"),
                              401: ERROR, 403: ERROR, 404: ERROR})
    def get(self, request, channel_id: str):
        channel = channel_or_404(channel_id)
        require_channel_reader(request, channel)
        types = event_types_list(channel_pks=[channel.pk])
        latest = max([channel.updated_at, *(t.updated_at for t in types)])
        document = asyncapi_document(channel_id=channel_id, channel_name=channel.name, host=request.get_host(),
                                     protocol="https" if request.is_secure() else "http", version=rfc3339(latest),
                                     types=[type_doc(t) for t in types])
        return JsonResponse(document, json_dumps_params={"indent": None})


WEBHOOKS_MAX = 5000  # event types in the OpenAPI schema (a schema larger than this is no use to read)


def schema_webhooks(result, generator, request, public):
    """drf-spectacular postprocessing hook (issue 37): every channel's event types as the OpenAPI 3.1
    ``webhooks`` a push consumer of the channel receives (``{channel}/{type}``; the operation's
    ``x-event-type`` and ``x-channel`` name them), their payload schemas as components, and the
    signature as a security scheme."""
    try:
        types = event_types_list(channel_pks=Channel.objects.values_list("pk", flat=True))[:WEBHOOKS_MAX]
    except Exception as exc:  # noqa: BLE001 - no database (`manage.py spectacular` offline, a test's collection)
        logger.warning("the OpenAPI schema is made without webhooks: the event types could not be read (%s)", exc)
        types = []
    components = result.setdefault("components", {})
    components.setdefault("securitySchemes", {})["webhookSignature"] = {
        "type": "apiKey", "in": "header", "name": "webhook-signature",
        "description": "Standard Webhooks signature of a push delivery (the consumer's signing secret)"}
    webhooks = {}
    for event_type in types:
        channel_id = event_type.channel.channel_id
        item, schema = openapi_webhook(channel_id=channel_id, doc=type_doc(event_type))
        webhooks[f"{channel_id}/{event_type.name}"] = item
        components.setdefault("schemas", {})[webhook_schema_name(channel_id, event_type.name)] = schema
    result["webhooks"] = webhooks
    return result
