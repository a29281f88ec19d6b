"""The pure rules of event types (eventtypes.rules, openapi_import, documents), without a database:
schemas and their reasons, the pointer of a fault, examples, the 3.0 to 2020-12 reading of an
imported schema, and the relocation of a schema's own $ref inside a document."""

from __future__ import annotations

import pytest

from broker.errors import InvalidInput
from eventtypes.documents import TypeDoc, asyncapi_document, schema_relocated, type_key
from eventtypes.openapi_import import openapi_webhooks_parse
from eventtypes.rules import (canonical, deprecated_parse, example_check, mode_parse, payload_fault, pointer,
                              schema_compile, schema_parse)


def test_pointer_escapes_per_rfc_6901():
    assert pointer([]) == "" and pointer(["a", 0, "b"]) == "/a/0/b"
    assert pointer(["a/b", "c~d"]) == "/a~1b/c~0d"


def test_a_fault_is_the_message_and_the_pointer():
    validator = schema_compile({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}})
    assert payload_fault(validator, {"tags": ["a"]}) is None
    message, where = payload_fault(validator, {"tags": ["a", 2]})
    assert where == "/tags/1" and "string" in message


def test_formats_are_asserted():
    validator = schema_compile({"type": "string", "format": "date-time"})
    assert payload_fault(validator, "2026-01-02T03:04:05Z") is None
    assert payload_fault(validator, "yesterday") is not None
    assert payload_fault(schema_compile({"type": "integer", "format": "int64"}), 5) is None  # unknown: ignored


@pytest.mark.parametrize("raw", ['{"type": "string"}', {"type": "string"}])
def test_a_schema_is_an_object_or_its_text(raw):
    assert schema_parse(raw, text=isinstance(raw, str)) == {"type": "string"}


@pytest.mark.parametrize("raw", ["", None, "null"])
def test_no_schema(raw):
    assert schema_parse(raw) is None


@pytest.mark.parametrize("raw", [[], 3, True, {"type": 5}, {"$schema": "https://json-schema.org/draft/2019-09/schema"},
                                 {"enum": ["a\x00"]}, {"description": "x" * 300_000}])
def test_what_is_not_a_schema(raw):
    with pytest.raises(InvalidInput) as caught:
        schema_parse(raw)
    assert caught.value.code == "invalid_schema"


def test_the_2020_12_dialect_may_be_named():
    assert schema_parse({"$schema": "https://json-schema.org/draft/2020-12/schema#", "prefixItems": [{"type": "integer"}]})


def test_example_check_names_the_place():
    with pytest.raises(InvalidInput, match="at /id") as caught:
        example_check({"id": "x"}, schema_compile({"properties": {"id": {"type": "integer"}}}), version=3)
    assert caught.value.code == "invalid_example" and "version 3" in caught.value.detail


def test_small_fields():
    assert mode_parse(" Closed ") == "closed" and mode_parse("") is None
    with pytest.raises(InvalidInput):
        mode_parse("half")
    assert deprecated_parse("yes") is True and deprecated_parse(False) is False and deprecated_parse(None) is None
    assert canonical({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical({"a": [1, {"c": 3, "d": 2}], "b": 1})


def test_an_openapi_3_0_schema_reads_as_2020_12():
    document = {"openapi": "3.0.1", "x-webhooks": {"e.v": {"post": {"requestBody": {"content": {
        "application/vnd.e+json": {"schema": {"$ref": "#/components/schemas/E"}}}}}}},
        "components": {"schemas": {"E": {"type": "object", "properties": {
            "n": {"type": "number", "maximum": 10, "exclusiveMaximum": True, "nullable": True},
            "m": {"type": "number", "minimum": 1, "exclusiveMinimum": False},
            "kind": {"enum": ["a", "b"], "nullable": True, "example": {"nullable": True}},
            "self": {"$ref": "#/components/schemas/E"}}}}}}
    [imported] = openapi_webhooks_parse(document).types
    props = imported.schema["properties"]
    assert props["n"] == {"type": ["number", "null"], "exclusiveMaximum": 10}
    assert props["m"] == {"type": "number", "minimum": 1}
    assert props["kind"]["enum"] == ["a", "b", None] and props["kind"]["example"] == {"nullable": True}  # data kept
    assert props["self"] == {"$ref": "#"}  # the root component referring to itself


def test_relocation_points_a_schemas_own_refs_at_its_new_place():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "items": {"$ref": "#/$defs/x"},
              "properties": {"me": {"$ref": "#"}}, "$defs": {"x": {"const": {"$ref": "#/not/a/ref"}}}}
    moved = schema_relocated(schema, "#/components/schemas/k")
    assert moved["items"]["$ref"] == "#/components/schemas/k/$defs/x"
    assert moved["properties"]["me"]["$ref"] == "#/components/schemas/k"
    assert moved["$defs"]["x"]["const"] == {"$ref": "#/not/a/ref"} and "$schema" not in moved
    assert schema_relocated(None, "#") == {} and type_key("a/b:c.d") == "a_b_c.d"


def test_the_asyncapi_document_names_every_message_in_every_operation():
    docs = [TypeDoc("a.b", "", {"type": "object"}, {"x": 1}, False, 2), TypeDoc("c/d", "D", None, None, True, 1)]
    document = asyncapi_document(channel_id="ch", channel_name="Ch", host="h:1", protocol="http", version="v",
                                 types=docs)
    for operation in document["operations"].values():
        assert [m["$ref"].rsplit("/", 1)[1] for m in operation["messages"]] == ["a.b", "c_d"]
    assert document["components"]["messages"]["c_d"]["x-deprecated"] is True
    assert document["components"]["schemas"]["c_d"] == {}
