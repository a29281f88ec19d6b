"""drf-spectacular leaves a request body given as a plain schema optional; a body the route cannot
go without (it names required fields, or is a non-empty list or bytes) is marked required here, so a
client generated from the schema never leaves it out (issue 29 part 5)."""

from __future__ import annotations


def body_needed(schema: dict) -> bool:
    """Whether no empty body satisfies ``schema``: it requires a property, holds at least one item or
    byte, or every alternative of its anyOf / oneOf does."""
    if not isinstance(schema, dict):
        return False
    if schema.get("required") or schema.get("minItems", 0) > 0 or schema.get("minLength", 0) > 0:
        return True
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    return bool(alternatives) and all(body_needed(alternative) for alternative in alternatives)


def schema_bodies_required(result, generator, request, public):
    """drf-spectacular postprocessing hook: ``requestBody.required`` where every media type's schema
    needs a body."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            if not body or body.get("required"):
                continue
            schemas = [media.get("schema") for media in body.get("content", {}).values()]
            if schemas and all(body_needed(schema) for schema in schemas):
                body["required"] = True
    return result
