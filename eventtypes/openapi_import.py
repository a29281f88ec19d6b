"""Event types from an OpenAPI document's webhooks (``POST /channel/{c}/event-types/import``): an
OpenAPI 3.1 document's ``webhooks`` or a 3.0 one's ``x-webhooks`` (as Svix and Convoy publish
theirs), each webhook an event type named by its key (or the operation's ``x-event-type``, which
the broker's own schema sets). Its ``post`` operation gives the description (``description``, else
``summary``), ``deprecated``, and the JSON request body's schema and example.

Schemas are made self-contained: a ``$ref`` to ``#/components/schemas/X`` becomes ``#/$defs/X``
with the component copied under ``$defs`` (recursive components included); any other ``$ref``
outside the schema is refused, nothing is fetched. OpenAPI 3.0 schemas are read as what they mean
in JSON Schema 2020-12: ``nullable: true`` adds ``null`` to the type, a boolean
``exclusiveMinimum`` / ``exclusiveMaximum`` becomes the number it qualifies. A webhook whose key is
not a message type, or without a POST, is skipped and reported; a schema that is not valid refuses
the whole import (nothing is changed); an example that does not validate is left out and reported.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from broker.errors import InvalidInput
from eventtypes.rules import (description_parse, event_type_name_parse, example_parse, payload_fault, schema_compile,
                              schema_parse, schema_refs_map)

_COMPONENT_SCHEMA = "#/components/schemas/"
_JSON_MEDIA = ("application/json",)


@dataclass
class Imported:
    """One webhook of the document, as an event type."""

    name: str
    schema: dict | None
    description: str
    example: object = None
    deprecated: bool = False


@dataclass
class ImportPlan:
    types: list[Imported] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"Webhook": key, "Reason": text}
    warnings: list[dict] = field(default_factory=list)  # {"Type": name, "Warning": text}


def openapi_webhooks_parse(document) -> ImportPlan:
    """The event types a document names; 400 ``invalid_document`` when it is not an OpenAPI 3.0 or
    3.1 document with webhooks, ``invalid_schema`` (naming the webhook) for a schema that is not valid."""
    if not isinstance(document, dict) or not isinstance(document.get("openapi"), str):
        raise InvalidInput("invalid_document", "the body must be an OpenAPI document (an object with 'openapi')")
    version = document["openapi"]
    if version.startswith("3.0"):
        webhooks, legacy = document.get("x-webhooks", document.get("webhooks")), True
    elif version.startswith(("3.1", "3.2")):
        webhooks, legacy = document.get("webhooks"), False
    else:
        raise InvalidInput("invalid_document", f"OpenAPI {version[:20]} is not supported: 3.0 (x-webhooks) or 3.1 "
                                               "(webhooks)")
    if not isinstance(webhooks, dict) or not webhooks:
        raise InvalidInput("invalid_document", "the document has no webhooks ('webhooks' in 3.1, 'x-webhooks' in 3.0)")
    plan = ImportPlan()
    seen = set()
    for key, item in webhooks.items():
        try:
            imported = _webhook(document, key, item, legacy, plan)
        except _Skip as skip:
            plan.skipped.append({"Webhook": str(key), "Reason": str(skip)})
            continue
        if imported.name in seen:
            plan.skipped.append({"Webhook": str(key), "Reason": f"event type {imported.name} is named twice"})
            continue
        seen.add(imported.name)
        plan.types.append(imported)
    return plan


class _Skip(Exception):
    """A webhook the import leaves out (the reason is reported)."""


def _webhook(document: dict, key, item, legacy: bool, plan: ImportPlan) -> Imported:
    item = _resolve(document, item, "#/components/pathItems/")
    operation = item.get("post") if isinstance(item, dict) else None
    if not isinstance(operation, dict):
        raise _Skip("no POST operation")
    raw_name = operation.get("x-event-type", key)
    try:
        name = event_type_name_parse(raw_name)
    except InvalidInput as exc:
        raise _Skip(exc.detail) from None
    text = operation.get("description") or operation.get("summary") or item.get("description") or item.get("summary")
    try:
        description = description_parse(text if isinstance(text, str) else "") or ""
    except InvalidInput:
        description = str(text)[:4096].replace("\x00", "")
    body = _resolve(document, operation.get("requestBody"), "#/components/requestBodies/")
    content = body.get("content") if isinstance(body, dict) else None
    media = _json_media(content)
    schema = example = None
    if media is not None:
        raw_schema = media.get("schema")
        if raw_schema is not None:
            schema = _bundle(document, raw_schema, legacy, name)
        example = _example(document, media, raw_schema)
    if schema is not None:
        try:
            schema = schema_parse(schema)
        except InvalidInput as exc:
            raise InvalidInput("invalid_schema", f"webhook {key}: {exc.detail}") from None
    if example is not None:
        try:
            example = example_parse(example)
            if schema is not None and payload_fault(schema_compile(schema), example) is not None:
                raise InvalidInput("invalid_example", "it does not validate against the schema")
        except InvalidInput as exc:
            plan.warnings.append({"Type": name, "Warning": f"example left out: {exc.detail}"})
            example = None
    return Imported(name=name, schema=schema, description=description, example=example,
                    deprecated=operation.get("deprecated") is True)


def _json_media(content) -> dict | None:
    """The JSON media type of a request body (application/json, else a +json one)."""
    if not isinstance(content, dict):
        return None
    for media_type, media in content.items():
        base = str(media_type).split(";", 1)[0].strip().lower()
        if (base in _JSON_MEDIA or base.endswith("+json")) and isinstance(media, dict):
            return media
    return None


def _example(document: dict, media: dict, schema) -> object:
    if "example" in media:
        return media["example"]
    examples = media.get("examples")
    if isinstance(examples, dict):
        for value in examples.values():
            value = _resolve(document, value, "#/components/examples/")
            if isinstance(value, dict) and "value" in value:
                return value["value"]
    if isinstance(schema, dict):
        schema = _resolve(document, schema, _COMPONENT_SCHEMA)
        if "example" in schema:
            return schema["example"]
        if isinstance(schema.get("examples"), list) and schema["examples"]:
            return schema["examples"][0]
    return None


def _resolve(document: dict, value, prefix: str):
    """Follow a ``$ref`` to a component of the document (``prefix``: where those components live),
    a few levels deep; anything else is returned as it is."""
    for _ in range(8):
        if not (isinstance(value, dict) and isinstance(value.get("$ref"), str)):
            return value
        ref = value["$ref"]
        if not ref.startswith(prefix):
            raise _Skip(f"$ref {ref[:100]} is not a component of this document")
        value = _component(document, ref)
    raise _Skip("$ref nested too deeply")


def _component(document: dict, ref: str):
    node = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise InvalidInput("invalid_document", f"$ref {ref[:100]} does not resolve in the document")
        node = node[part]
    return node


def _bundle(document: dict, schema, legacy: bool, name: str) -> dict:
    """``schema`` with its component references under ``$defs`` (3.0 schemas converted)."""
    schema = copy.deepcopy(schema)
    root_component = None
    defs: dict = {}
    pending = []

    def ref_moved(value: str) -> str:
        if value.startswith(_COMPONENT_SCHEMA):
            component, slash, rest = value[len(_COMPONENT_SCHEMA):].partition("/")
            if component == root_component:  # the root itself (a recursive schema)
                return "#" + slash + rest
            if component not in defs and component not in pending:
                pending.append(component)
            return "#/$defs/" + component + slash + rest
        if value.startswith("#/$defs/") or value == "#":
            return value
        raise InvalidInput("invalid_schema", f"webhook {name}: $ref {value[:100]} is neither a schema "
                                             "component of the document nor inside the schema")

    def walk(node):
        return schema_refs_map(node, ref_moved, finish=_legacy if legacy else None)

    if not isinstance(schema, dict):
        raise InvalidInput("invalid_schema", f"webhook {name}: the request body's schema is not an object")
    ref = schema.get("$ref")
    if set(schema) == {"$ref"} and isinstance(ref, str) and ref.startswith(_COMPONENT_SCHEMA) \
            and "/" not in ref[len(_COMPONENT_SCHEMA):]:
        root_component = ref[len(_COMPONENT_SCHEMA):]
        schema = copy.deepcopy(_component(document, ref))  # the body is a component: it becomes the root
        if not isinstance(schema, dict):
            raise InvalidInput("invalid_schema", f"webhook {name}: {ref[:100]} is not a schema object")
    root = walk(schema)
    while pending:
        component = pending.pop(0)
        found = _component(document, _COMPONENT_SCHEMA + component)
        defs[component] = walk(copy.deepcopy(found))
        if len(defs) > 500:
            raise InvalidInput("invalid_schema", f"webhook {name}: more than 500 schema components")
    if defs:
        root["$defs"] = {**root.get("$defs", {}), **defs}
    return root


def _legacy(node: dict) -> dict:
    """An OpenAPI 3.0 schema object as JSON Schema 2020-12: ``nullable`` and the boolean exclusive bounds."""
    if node.pop("nullable", False) is True:
        kind = node.get("type")
        if isinstance(kind, str):
            node["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            node["type"] = [*kind, "null"]
        elif "enum" in node and isinstance(node["enum"], list) and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(flag), bool):
            if node.pop(flag) and bound in node:
                node[flag] = node.pop(bound)
    return node
