"""The OpenAPI request bodies of the registry PUTs (issue 25 part 4) and the links from them.

``PUT /channel/{c}``, ``PUT /producer/{p}`` and ``PUT /channel/{c}/consumer/{k}`` take form fields
or a JSON object; each field's schema carries the bounds its parser enforces (web/api/registry.py,
web/api/consumers.py, broker/registry.text_check, consumers.filters, consumers.priority,
broker.message_types), so data the schema allows is data the API accepts, apart from rules
that span fields (a push consumer needs a callbackUrl; priority fields only on pull consumers; an
update needs If-Unmodified-Since). ``schema_links`` (a postprocessing hook) adds OpenAPI links from
each PUT's 200 to the operations that need the resource it created.
"""

from __future__ import annotations

from broker.durations import RETENTION_MAX, RETENTION_MIN

INT32_MAX = 2**31 - 1
NO_NUL = r"^[^\u0000]*$"  # PostgreSQL text cannot hold NUL
TEXT = {"type": "string", "maxLength": 255, "pattern": NO_NUL}
TOKEN = {**TEXT, "description": "secret the channel/producer/consumer presents (1-255 characters, no NUL); "
                                "absent or empty on create: one is generated; absent on update: unchanged"}
NAME = {**TEXT, "description": "display name (default: the id; empty: unchanged)"}
SECONDS = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e9}  # OpenAPI 3.1: numeric bounds
COUNT = {"type": "integer", "minimum": 1, "maximum": INT32_MAX}
COUNT_OR_ZERO = {"type": "integer", "minimum": 0, "maximum": INT32_MAX}
TTL = {"type": "integer", "minimum": 1, "maximum": 31_536_000}
MESSAGE_TYPE = r"(\*|[A-Za-z0-9._:/-]{1,128}(\.\*)?)"

CHANNEL_PUT = {
    "type": "object",
    "properties": {
        "token": TOKEN,
        "name": NAME,
        "messageTTL": {"description": "default TTL of the channel's messages in seconds; 'none' clears it",
                       "anyOf": [TTL, {"type": "string", "enum": ["none", ""]}]},
        "retention": {"description": "how long a message whose jobs are all finished stays stored (broker.durations): "
                                     "seconds (1..315360000) or a number with a unit s, m, h, d, w up to 3650d; "
                                     "empty or 'none': BROKER_RETENTION",
                      "anyOf": [{"type": "integer", "minimum": RETENTION_MIN, "maximum": RETENTION_MAX},
                                {"type": "string", "pattern": "^[1-9][0-9]{0,2}[smhdSMHD]$"},
                                {"type": "string", "enum": ["none", ""]}]},
        "eventTypes": {"type": "string", "enum": ["open", "closed", ""],
                       "description": "open: a message whose type has no event type passes; closed: refused "
                                      "(422 unknown_event_type); empty: unchanged"},
    },
}

PRODUCER_PUT = {
    "type": "object",
    "properties": {
        "token": TOKEN,
        "name": NAME,
        "rateLimitPerSecond": {"type": "number", "minimum": 0, "exclusiveMaximum": 1e9,
                               "description": "messages per second (token bucket); 0 clears the limit"},
        "burst": {**COUNT, "description": "bucket size (default max(1, rateLimitPerSecond))"},
    },
}

# A content filter (consumers.filters): two levels are described here ($or / $and of body/headers
# filters); the API accepts nesting up to 8 levels, at most 100 conditions and 16 KiB.
_SCALAR = {"anyOf": [{"type": "string", "maxLength": 256, "pattern": NO_NUL}, {"type": "number"},
                     {"type": "boolean"}, {"type": "null"}]}
_HEADER_TEXT = {"type": "string", "maxLength": 256, "pattern": NO_NUL}


def _operators(value: dict, order: dict) -> dict:
    return {"type": "object", "minProperties": 1, "maxProperties": 2, "additionalProperties": False,
            "properties": {"$eq": value, "$ne": value,
                           "$in": {"type": "array", "items": value, "minItems": 1, "maxItems": 10},
                           "$nin": {"type": "array", "items": value, "minItems": 1, "maxItems": 10},
                           "$gt": order, "$gte": order, "$lt": order, "$lte": order,
                           "$exists": {"type": "boolean"},
                           "$startsWith": {"type": "string", "maxLength": 256, "pattern": NO_NUL}}}


_ORDERED = {"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 256, "pattern": NO_NUL}]}
# Key rules (propertyNames: JSON Schema 2020-12, which OpenAPI 3.1 schemas are)
_BODY_PATH = {"pattern": r"^[^$.\u0000][^.\u0000]*(\.[^.\u0000]+)*$", "minLength": 1, "maxLength": 255}
_HEADER_NAME = {"pattern": r"^[!-#%-9;-~][!-9;-~]*$", "minLength": 1, "maxLength": 255}
FILTER_BODY = {"type": "object", "minProperties": 1, "maxProperties": 5, "propertyNames": _BODY_PATH,
               "additionalProperties": {"anyOf": [_SCALAR, _operators(_SCALAR, _ORDERED)]},
               "description": "dotted paths into the JSON payload (order.total, items.0.sku; 1-255 characters, "
                              "no empty segment, not starting with $): a literal (equality) or operators"}
FILTER_HEADERS = {"type": "object", "minProperties": 1, "maxProperties": 3, "propertyNames": _HEADER_NAME,
                  "additionalProperties": {"anyOf": [_HEADER_TEXT, _operators(_HEADER_TEXT, _HEADER_TEXT)]},
                  "description": "stored metadata header names (case-insensitive; printable ASCII without space "
                                 "or colon, not starting with $): a string or operators"}
_FILTER_LEAF = {"type": "object", "minProperties": 1, "additionalProperties": False,
                "properties": {"body": FILTER_BODY, "headers": FILTER_HEADERS}}
FILTER = {
    "type": "object", "minProperties": 1, "additionalProperties": False,
    "properties": {"body": FILTER_BODY, "headers": FILTER_HEADERS,
                   "$or": {"type": "array", "items": _FILTER_LEAF, "minItems": 1, "maxItems": 2},
                   "$and": {"type": "array", "items": _FILTER_LEAF, "minItems": 1, "maxItems": 2}},
    "description": 'content filter {"body": {...}, "headers": {...}}, $or / $and lists at any level (up to 8 '
                   "levels, 100 conditions, 16 KiB); every condition must hold; a body condition never matches a "
                   "payload that is not JSON; 400 invalid_filter names what is wrong",
}

CONSUMER_PUT = {
    "type": "object",
    "properties": {
        "token": TOKEN,
        "name": NAME,
        "callbackUrl": {"description": "absolute http(s) URL (push: required; pull: the doorbell, optional)",
                        "anyOf": [{"type": "string", "format": "uri", "pattern": r"^https?://[A-Za-z0-9]",
                                   "maxLength": 2048}, {"type": "string", "maxLength": 0}]},
        "type": {"type": "string", "enum": ["push", "pull", ""], "description": "empty: push"},
        "maxInFlight": COUNT,
        "maxDeliveriesPerSecond": SECONDS,
        "connectionTimeout": {**SECONDS, "description": "seconds a push attempt may take"},
        "maxAckPending": {**COUNT, "description": "default 1000"},
        "maxQueued": {"description": "default unlimited; 0 or 'unlimited' clears it",
                      "anyOf": [COUNT_OR_ZERO, {"type": "string", "enum": ["unlimited", "none"]}]},
        "ordered": {"description": "one job of a partition in flight at a time, in publish order",
                    "anyOf": [{"type": "boolean"},
                              {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]}]},
        "maxRetry": COUNT_OR_ZERO,
        "retryBackoff": {"type": "string", "maxLength": 255,
                         "pattern": r"^ *[0-9]{1,9}(\.[0-9]{1,6})? *(, *[0-9]{1,9}(\.[0-9]{1,6})? *)*$",
                         "description": "comma-separated seconds between attempts"},
        "signingSecret": {"description": "Standard Webhooks secret: whsec_ + base64 of 24-64 bytes (empty: unchanged)",
                          "anyOf": [{"type": "string", "pattern": r"^(whsec_)?([A-Za-z0-9+/]{4}){8,21}$"},
                                    {"type": "string", "maxLength": 0}]},
        "circuitBreakerFailures": {**COUNT_OR_ZERO, "description": "consecutive failed attempts before the circuit "
                                                                   "may open; default 10, 0 = off"},
        "circuitBreakerOpenAfterSeconds": {"type": "number", "minimum": 0, "exclusiveMaximum": 1e9,
                                           "description": "and no successful attempt for this long (default 10; "
                                                          "0: on the failures alone)"},
        "circuitBreakerProbeSeconds": {**SECONDS, "description": "seconds between probes while open (default 30)"},
        "notifyInterval": {**SECONDS, "description": "doorbell of a pull consumer with a callbackUrl (default 1)"},
        "priorityPolicy": {"type": "string", "enum": ["none", "overflow", "pinned_client", "prioritized"],
                           "description": "pull consumers only; fixed once set"},
        "priorityGroups": {"type": "string", "pattern": r"^[a-zA-Z0-9/_=-]{1,16}$",
                           "description": "one group name (pull consumers with a priorityPolicy)"},
        "priorityTimeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 31_536_000},
        "messageTypes": {"type": "string", "pattern": rf"^({MESSAGE_TYPE}(,{MESSAGE_TYPE})*)?$",
                         "description": "comma-separated type patterns: a type, prefix.*, or *; empty: all"},
        "filter": {"description": "content filter: the object (JSON body) or its JSON text (form field); "
                                  "empty: none; absent: unchanged",
                   "anyOf": [{"$ref": "#/components/schemas/ConsumerFilter"}, {"type": "string", "maxLength": 0}]},
    },
}
# Rules across fields (consumer_upsert, consumers.priority): a push consumer needs a callback URL
# (on create; an update may leave it out, which the schema does not tell apart) and has no priority
# fields; a pull consumer may have a callback URL (its doorbell) and either no priority policy, or a
# policy with its one group (and optionally a timeout).
_NO_PRIORITY = {"not": {"anyOf": [{"required": ["priorityGroups"]}, {"required": ["priorityTimeout"]}]}}
CONSUMER_PUT["anyOf"] = [
    {"required": ["callbackUrl"], **_NO_PRIORITY,
     "properties": {"type": {"enum": ["push", ""]}, "callbackUrl": {"minLength": 1},
                    "priorityPolicy": {"enum": ["none"]}}},
    {"required": ["type"], **_NO_PRIORITY,
     "properties": {"type": {"enum": ["pull"]}, "priorityPolicy": {"enum": ["none"]}}},
    {"required": ["type", "priorityPolicy", "priorityGroups"],
     "properties": {"type": {"enum": ["pull"]}, "priorityPolicy": {"enum": ["overflow", "pinned_client", "prioritized"]}}},
]
# Form fields carry text: the filter as JSON text (any string; 400 invalid_filter when it is not one).
CONSUMER_PUT_FORM = {**CONSUMER_PUT, "properties": {**CONSUMER_PUT["properties"], "filter": {
    "type": "string", "maxLength": 65536,
    "description": "content filter as JSON text (see ConsumerFilter); empty: none"}}}


def put_request(schema: dict, form: dict | None = None) -> dict:
    """``extend_schema(request=...)``: the same fields as JSON or as form fields."""
    return {"application/json": schema, "application/x-www-form-urlencoded": form or schema,
            "multipart/form-data": form or schema}


ID_PARAMS = ("channel_id", "producer_id", "consumer_id")
ID = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[^/\u0000]+$"}
_CHANNEL = {"channel_id": "$request.path.channel_id"}
_CONSUMER = {**_CHANNEL, "consumer_id": "$request.path.consumer_id"}
LINKS = {  # PUT operationId -> {link name: (target operationId, parameters)}
    "channel_update": {
        "GetChannel": ("channel_retrieve", _CHANNEL),
        "PutConsumer": ("channel_consumer_update", _CHANNEL),
        "ListConsumers": ("channel_consumers_retrieve", _CHANNEL),
        "Broadcast": ("channel_broadcast_create", _CHANNEL),
        "PublishBatch": ("channel_messages_create", _CHANNEL),
        "ListMessages": ("channel_messages_retrieve", _CHANNEL),
        "MessagesStatus": ("channel_messages_status_retrieve", _CHANNEL),
    },
    "producer_update": {
        "GetProducer": ("producer_retrieve", {"producer_id": "$request.path.producer_id"}),
    },
    "channel_consumer_update": {
        "GetConsumer": ("channel_consumer_retrieve", _CONSUMER),
        "DeleteConsumer": ("channel_consumer_destroy", _CONSUMER),
        "PauseConsumer": ("channel_consumer_pause_create", _CONSUMER),
        "ResumeConsumer": ("channel_consumer_resume_create", _CONSUMER),
        "Replay": ("channel_consumer_replay_create", _CONSUMER),
        "CloseCircuit": ("channel_consumer_circuit_close_create", _CONSUMER),
        "QueuedJobs": ("channel_consumer_queued_jobs_retrieve", _CONSUMER),
        "DeadLetterQueue": ("channel_consumer_dlq_retrieve", _CONSUMER),
        "Partitions": ("channel_consumer_partitions_retrieve", _CONSUMER),
        "RotateSecret": ("channel_consumer_rotate_secret_create", _CONSUMER),
    },
}


def schema_links(result, generator, request, public):
    """drf-spectacular postprocessing hook: the ConsumerFilter component, and links from each PUT's
    200 to the operations that need what it created (only to operations present in the schema)."""
    result.setdefault("components", {}).setdefault("schemas", {})["ConsumerFilter"] = FILTER
    for operations_of_path in result.get("paths", {}).values():  # ids: what the columns hold (text_check)
        for op in operations_of_path.values():
            for param in op.get("parameters", []) if isinstance(op, dict) else []:
                if param.get("in") == "path" and param.get("name") in ID_PARAMS:
                    param["schema"] = ID
    operations = {op.get("operationId"): op for ops in result.get("paths", {}).values()
                  for op in ops.values() if isinstance(op, dict)}
    body = operations.get("channel_consumer_update", {}).get("requestBody")
    if body is not None:
        body["required"] = True  # a consumer needs at least its type or callbackUrl
    for put_id, links in LINKS.items():
        response = operations.get(put_id, {}).get("responses", {}).get("200")
        if response is None:
            continue
        response["links"] = {name: {"operationId": target, "parameters": dict(parameters),
                                    "description": f"{target} of the resource this PUT created or updated"}
                             for name, (target, parameters) in links.items() if target in operations}
    return result
