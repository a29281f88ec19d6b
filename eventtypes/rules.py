"""The pure rules of event types: what a schema, an example, a description and a channel's
``eventTypes`` may be, the compiled validator of a schema and the fault it finds in a payload.

Schemas are JSON Schema draft 2020-12, compiled by ``jsonschema_rs`` (chosen by measurement,
bench/schemas.py: ~15 us per validation of a 20-property payload where ``jsonschema`` takes
~550 us and ``fastjsonschema`` ~40 us without draft 2020-12). Compiling checks the schema against
the 2020-12 meta-schema and resolves its ``$ref``; nothing is fetched (``offline``): a ``$ref``
must point inside the schema (``#/$defs/...``). Formats (``date-time``, ``email``, ``uuid``, ...)
are asserted, not only annotations: a producer team writing ``"format": "date-time"`` expects a
date to be checked; formats the library does not know (OpenAPI's ``int64``) are ignored.
"""

from __future__ import annotations

import json

import jsonschema_rs

from broker.errors import InvalidInput
from broker.message_types import message_type_parse

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_MAX_BYTES = 256 * 1024
EXAMPLE_MAX_BYTES = 64 * 1024
DESCRIPTION_MAX = 4096
DETAIL_MAX = 500  # characters of a validation message kept in a 422's detail
MODES = ("open", "closed")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
SCHEMA_DATA = ("example", "examples", "enum", "const", "default", "x-examples")  # keywords whose values are data


def schema_refs_map(node, ref, *, finish=None):
    """A copy of the schema ``node`` with each ``$ref`` replaced by ``ref(value)`` (which may raise),
    and each schema object passed through ``finish`` once its parts are copied. Keys of the maps of
    schemas (``properties``...) are names, and the values of data keywords (``enum``...) data: a
    property called ``$ref`` or an example holding one is left alone."""
    if isinstance(node, list):
        return [schema_refs_map(x, ref, finish=finish) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = ref(value)
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: schema_refs_map(v, ref, finish=finish) for k, v in value.items()}
        elif key in SCHEMA_DATA:
            out[key] = value
        else:
            out[key] = schema_refs_map(value, ref, finish=finish)
    return out if finish is None else finish(out)


def event_type_name_parse(raw) -> str:
    """``{type}`` of the routes: a message type (``broker.message_types``: 1-128 characters of
    ``A-Z a-z 0-9 . _ : / -``); 400 ``invalid_message_type`` otherwise."""
    name = message_type_parse(raw, field="the event type")
    if name is None:
        raise InvalidInput("invalid_message_type", "the event type must not be empty")
    return name


def json_text_load(text, *, code: str, label: str):
    """A JSON value from text (str or bytes). NaN and Infinity are not JSON; 400 ``code`` otherwise."""
    try:
        return json.loads(text, parse_constant=not_json)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(code, f"{label} is not JSON: {str(exc)[:200]}") from None


def not_json(name: str):
    """``json.loads``'s ``parse_constant``: NaN, Infinity and -Infinity are Python's, not JSON."""
    raise ValueError(f"{name} is not JSON")


def _size_check(value, *, limit: int, code: str, label: str) -> None:
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput(code, f"{label} is not JSON") from None
    if len(text.encode()) > limit:
        raise InvalidInput(code, f"{label} is larger than {limit // 1024} KiB")
    if "\\u0000" in text:  # PostgreSQL jsonb cannot hold NUL
        raise InvalidInput(code, f"{label} must not contain NUL characters")


def schema_parse(raw, *, text: bool = False) -> dict | None:
    """``schema`` of the PUT: a JSON object, or a string holding one (``text``: a form field, always a
    string). An empty string or JSON null: no schema (any payload). 400 ``invalid_schema`` with the
    reason for anything else, and for a schema that does not compile (``schema_compile``)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw.strip() == "":
            return None
        raw = json_text_load(raw, code="invalid_schema", label="schema")
        if raw is None:
            return None
    if not isinstance(raw, dict):
        raise InvalidInput("invalid_schema", "schema must be a JSON object (a JSON Schema, draft 2020-12)")
    _size_check(raw, limit=SCHEMA_MAX_BYTES, code="invalid_schema", label="schema")
    dialect = raw.get("$schema")
    if dialect is not None and (not isinstance(dialect, str) or dialect.rstrip("#") != DIALECT):
        raise InvalidInput("invalid_schema", f"$schema must be {DIALECT} (draft 2020-12) or left out")
    schema_compile(raw)
    return raw


def schema_compile(schema: dict):
    """The compiled validator of ``schema``; 400 ``invalid_schema`` with the reason when it is not a
    valid draft 2020-12 schema (meta-schema, ``$ref`` that do not resolve inside it, bad regex)."""
    try:
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=True, offline=True)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError, TypeError) as exc:
        reason = getattr(exc, "message", None) or str(exc).split("\n", 1)[0]
        where = pointer(getattr(exc, "instance_path", None) or [])
        raise InvalidInput("invalid_schema", f"schema is not a valid JSON Schema (draft 2020-12): {reason[:DETAIL_MAX]}"
                           + (f" (at {where})" if where else "")) from None


def payload_fault(validator, instance) -> tuple[str, str] | None:
    """The first place ``instance`` breaks the compiled schema: (message, JSON pointer into the
    instance, "" for the instance itself); None when it validates."""
    try:
        validator.validate(instance)
    except jsonschema_rs.ValidationError as exc:
        return exc.message[:DETAIL_MAX], pointer(exc.instance_path)
    return None


def pointer(parts) -> str:
    """A JSON pointer (RFC 6901) of path parts (keys and array indexes)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def example_parse(raw, *, text: bool = False):
    """``example`` of the PUT: any JSON value (``text``: a form field holding JSON text). None:
    no example (JSON null, or an empty form field)."""
    if text:
        if raw is None or str(raw).strip() == "":
            return None
        raw = json_text_load(str(raw), code="invalid_example", label="example")
    if raw is not None:
        _size_check(raw, limit=EXAMPLE_MAX_BYTES, code="invalid_example", label="example")
    return raw


def example_check(example, validator, *, version: int | None = None) -> None:
    """400 ``invalid_example`` when the example does not validate against the schema."""
    fault = payload_fault(validator, example)
    if fault is not None:
        message, where = fault
        of = f"version {version} of the schema" if version else "the schema"
        raise InvalidInput("invalid_example", f"example does not validate against {of}: {message} "
                                              f"(at {where or 'the example itself'})")


def description_parse(raw) -> str | None:
    """``description``: text up to 4,096 characters (None: unchanged)."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput("invalid_description", "description must be a string")
    if len(raw) > DESCRIPTION_MAX or "\x00" in raw:
        raise InvalidInput("invalid_description", f"description must be at most {DESCRIPTION_MAX} characters, no NUL")
    return raw


_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def deprecated_parse(raw) -> bool | None:
    """``deprecated``: a boolean, or its text (true/false, 1/0, yes/no, on/off); None: unchanged."""
    if raw is None or isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip() == "":
        return None
    value = _BOOLEANS.get(str(raw).strip().lower())
    if value is None:
        raise InvalidInput("invalid_deprecated", "deprecated must be true or false")
    return value


def mode_parse(raw) -> str | None:
    """A channel's ``eventTypes``: ``open`` (a type without an event type passes) or ``closed``
    (refused: 422 unknown_event_type); None or empty: unchanged; 400 ``invalid_event_types``."""
    if raw is None or str(raw).strip() == "":
        return None
    value = str(raw).strip().lower()
    if value not in MODES:
        raise InvalidInput("invalid_event_types", "eventTypes must be open or closed")
    return value


def canonical(value) -> str:
    """JSON text that is equal for equal values (keys sorted): two schemas are the same version when
    their canonical texts are."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
