"""The OpenAPI schemas of publishing (issue 29 part 5): the publish headers and the batch body, each
with the bounds its parser enforces (``web.api.publishing``: ``parse_priority``, ``parse_message_id``,
``batch_parse``; ``jobs.publish.messages.partition_parse``; ``broker.message_types``), so a publish
the schema allows is one the broker takes. What one header cannot say about another is in the
descriptions: X-Broker-Gate needs X-Broker-Partition-Key, a scheduled message has no partition key.
"""

from __future__ import annotations

from broker.message_types import MESSAGE_TYPE_MAX, TTL_MAX, TTL_MIN
from jobs.publish.messages import GATE_MAX, PARTITION_KEY_MAX
from web.api.put_schemas import NO_NUL

INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
TTL = {"type": "integer", "minimum": TTL_MIN, "maximum": TTL_MAX}
GATE = {"type": "integer", "minimum": 0, "maximum": GATE_MAX}
MESSAGE_TYPE = {"type": "string", "pattern": rf"^([A-Za-z0-9._:/-]{{1,{MESSAGE_TYPE_MAX}}})?$"}
MESSAGE_ID = {"type": "string", "maxLength": 255, "pattern": NO_NUL}
# not blank (400 invalid_partition_key), no NUL (PostgreSQL text)
PARTITION_KEY = {"type": "string", "minLength": 1, "maxLength": PARTITION_KEY_MAX,
                 "pattern": r"^[^\u0000]*[^\s\u0000][^\u0000]*$"}
PAYLOAD = {"type": "string", "format": "binary", "minLength": 1}  # stored as-is; empty: 400 empty_body


def publish_request(schema: dict) -> dict:
    """``extend_schema(request=...)`` of a single publish: any media type, stored with its Content-Type
    (``application/octet-stream`` named so that a client has a concrete one to send)."""
    return {"application/octet-stream": schema, "*/*": schema}


_TEXT = {"type": "string", "pattern": NO_NUL}
BATCH_ITEM = {
    "type": "object", "required": ["Payload"], "additionalProperties": False,
    "properties": {
        "Payload": {"description": "a string is stored as its UTF-8 bytes, any other JSON value as JSON "
                                   "(ContentType application/json unless given); not empty",
                    "anyOf": [{"type": "string", "minLength": 1}, {"type": "number"}, {"type": "boolean"},
                              {"type": "object"}, {"type": "array", "items": {}}]},
        "MessageID": {**MESSAGE_ID, "description": "default: a new xid"},
        "Priority": {**INT32, "default": 0},
        "ContentType": {**_TEXT, "maxLength": 255, "default": "application/octet-stream"},
        "PartitionKey": PARTITION_KEY,
        "Gate": {**GATE, "description": "with a PartitionKey (default 0)"},
        "Type": {**MESSAGE_TYPE, "type": ["string", "null"]},
        "TTL": {**TTL, "type": ["integer", "null"], "description": "seconds"},
        "traceparent": {**_TEXT, "description": "W3C trace context; invalid: a new trace"},
        "tracestate": _TEXT,
    },
    # a Gate only with a PartitionKey (400 invalid_gate)
    "anyOf": [{"not": {"required": ["Gate"]}}, {"required": ["PartitionKey"]}],
}


def batch_request(max_messages: int) -> dict:
    """The batch body: a JSON list of messages, or ``{"Messages": [...]}``."""
    items = {"type": "array", "items": BATCH_ITEM, "minItems": 1, "maxItems": max_messages}
    return {"application/json": {"anyOf": [
        items, {"type": "object", "required": ["Messages"], "properties": {"Messages": items}}]}}
