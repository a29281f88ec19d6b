"""The documents of a channel's event types, built from plain values (``TypeDoc``): the AsyncAPI
3.0 document of a channel (``GET /channel/{c}/asyncapi.json``) and the OpenAPI 3.1 ``webhooks``
entries of the broker's schema (``/api/schema/``, a postprocessing hook in web.api).

Each event type's schema goes to ``components.schemas`` under the type's key, with its own
``$ref`` (``#``, ``#/$defs/...``) rewritten to point there: inside a larger document a ``#`` is the
document's root, not the schema's, and both standard parsers resolve it so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eventtypes.rules import schema_refs_map

ASYNCAPI_VERSION = "3.0.0"
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# What a push delivery carries besides the payload (jobs.push.delivery.request_headers).
DELIVERY_HEADERS = {
    "webhook-id": "Standard Webhooks: the job ID (the same on every retry: deduplicate on it)",
    "webhook-timestamp": "Standard Webhooks: seconds since the epoch when the attempt was signed",
    "webhook-signature": "Standard Webhooks: v1,<base64 HMAC-SHA256 of '{webhook-id}.{webhook-timestamp}.{body}' with "
                         "the consumer's signing secret> (during a rotation, one per secret, space-separated)",
    "X-Broker-Message-ID": "the message's id in its channel",
    "X-Broker-Channel-ID": "the channel",
    "X-Broker-Consumer-ID": "the consumer this delivery is for",
    "X-Broker-Consumer-Token": "the consumer's token (the header name is BROKER_CONSUMER_TOKEN_HEADER)",
    "X-Broker-Message-Type": "the event type",
}


@dataclass(frozen=True)
class TypeDoc:
    """One event type as the documents show it."""

    name: str
    description: str
    schema: dict | None
    example: object
    deprecated: bool
    version: int


def type_key(name: str) -> str:
    """A component key for an event type (AsyncAPI keys are ``[A-Za-z0-9._-]``)."""
    return _KEY_UNSAFE.sub("_", name)


def schema_relocated(schema: dict | None, base: str) -> dict:
    """``schema`` (None: any JSON) with its local ``$ref`` made relative to ``base``, the pointer of
    where it is put in a document (``#/components/schemas/<key>``)."""
    if schema is None:
        return {}

    relocated = schema_refs_map(schema, lambda value: base + value[1:] if value.startswith("#") else value)
    relocated.pop("$schema", None)  # the document's own dialect applies
    return relocated


def _text(doc: TypeDoc) -> str:
    text = doc.description or f"Event type {doc.name}."
    return text + (" Deprecated: producers should stop sending it." if doc.deprecated else "")


def asyncapi_document(*, channel_id: str, channel_name: str, host: str, protocol: str, version: str,
                      types: list[TypeDoc]) -> dict:
    """The channel as an AsyncAPI 3.0 document, from the broker's side: it receives the channel's
    events from producers (``publish``), sends each to the push consumers' callback URLs
    (``deliverPush``, signed per Standard Webhooks) and hands them to pull consumers
    (``deliverPull``); one message per event type with its payload schema and example."""
    keys = {doc.name: type_key(doc.name) for doc in types}
    messages, schemas = {}, {}
    for doc in types:
        key = keys[doc.name]
        base = f"#/components/schemas/{key}"
        schemas[key] = schema_relocated(doc.schema, base)
        message = {
            "name": doc.name, "title": doc.name, "summary": _text(doc).split("\n", 1)[0][:200],
            "description": _text(doc), "contentType": "application/json",
            "payload": {"$ref": base},
            "headers": {"type": "object", "properties": {"X-Broker-Message-Type": {"type": "string", "const": doc.name}}},
            "x-event-type-version": doc.version, "x-deprecated": doc.deprecated,
        }
        if doc.example is not None:
            message["examples"] = [{"name": "example", "summary": f"An example of {doc.name}"[:200],
                                    "payload": doc.example}]
        messages[key] = message
    refs = {key: {"$ref": f"#/components/messages/{key}"} for key in keys.values()}
    base_path = f"/channel/{channel_id}"

    def channel_messages(name: str) -> list[dict]:
        return [{"$ref": f"#/channels/{name}/messages/{key}"} for key in keys.values()]

    def security(*names: str) -> list[dict]:
        return [{"$ref": f"#/components/securitySchemes/{name}"} for name in names]

    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {"title": f"{channel_name} ({channel_id})", "version": version,
                 "description": f"The event types of channel {channel_id} on this broker: what producers publish "
                                "to it (each message's type is an event type; one with a schema is validated "
                                "at publish) and what its push and pull consumers receive."},
        "defaultContentType": "application/json",
        "servers": {"broker": {"host": host, "protocol": protocol, "description": "the broker's HTTP API",
                               "security": security("channelToken", "producerToken", "consumerToken", "adminToken")}},
        "channels": {
            "publish": {"address": f"{base_path}/broadcast", "title": "Publish",
                        "description": "POST one message (its type in X-Broker-Message-Type); "
                                       f"POST {base_path}/messages publishes a batch",
                        "messages": dict(refs), "servers": [{"$ref": "#/servers/broker"}]},
            "push": {"address": None, "title": "Push delivery",
                     "description": "each push consumer's callback URL: a POST per message, signed",
                     "messages": dict(refs)},
            "pull": {"address": f"{base_path}/consumer/{{consumerId}}/pull", "title": "Pull delivery",
                     "description": "a pull consumer POSTs here and receives jobs, each holding one message "
                                    "(Message.Payload), then acks them",
                     "parameters": {"consumerId": {"description": "a pull consumer of the channel"}},
                     "messages": dict(refs), "servers": [{"$ref": "#/servers/broker"}]},
        },
        "operations": {
            "publish": {"action": "receive", "channel": {"$ref": "#/channels/publish"},
                        "summary": "The broker receives an event from a producer",
                        "security": security("channelToken", "producerToken"), "messages": channel_messages("publish")},
            "deliverPush": {"action": "send", "channel": {"$ref": "#/channels/push"},
                            "summary": "The broker delivers an event to a push consumer's callback URL",
                            "description": "2xx: delivered; 410: gone (the job is dead); anything else is retried "
                                           "with backoff until maxRetry",
                            "security": security("webhookSignature", "deliveryConsumerToken"),
                            "messages": channel_messages("push")},
            "deliverPull": {"action": "send", "channel": {"$ref": "#/channels/pull"},
                            "summary": "The broker hands events to a pull consumer",
                            "security": security("channelToken", "consumerToken"), "messages": channel_messages("pull")},
        },
        "components": {
            "schemas": schemas,
            "messages": messages,
            "securitySchemes": {
                "channelToken": {"type": "httpApiKey", "name": "X-Broker-Channel-Token", "in": "header",
                                 "description": "the channel's token"},
                "producerToken": {"type": "httpApiKey", "name": "X-Broker-Producer-Token", "in": "header",
                                  "description": "the producer's token, with its id in X-Broker-Producer-ID"},
                "consumerToken": {"type": "httpApiKey", "name": "X-Broker-Consumer-Token", "in": "header",
                                  "description": "a pull consumer's token"},
                "adminToken": {"type": "httpApiKey", "name": "X-Broker-Admin-Token", "in": "header",
                               "description": "BROKER_ADMIN_TOKEN: the registry (event types among it)"},
                "webhookSignature": {"type": "httpApiKey", "name": "webhook-signature", "in": "header",
                                     "description": DELIVERY_HEADERS["webhook-signature"]},
                "deliveryConsumerToken": {"type": "httpApiKey", "name": "X-Broker-Consumer-Token", "in": "header",
                                          "description": "sent with every push delivery: the consumer's token"},
            },
        },
    }


def webhook_schema_name(channel_id: str, name: str) -> str:
    """The OpenAPI component of an event type's payload schema (keys ``[A-Za-z0-9._-]``)."""
    return f"EventType.{type_key(channel_id)}.{type_key(name)}"


def openapi_webhook(*, channel_id: str, doc: TypeDoc) -> tuple[dict, dict]:
    """An event type as an OpenAPI 3.1 webhook (what a push consumer of the channel receives, as Svix
    documents its events) and its payload schema: (path item, component schema)."""
    component = webhook_schema_name(channel_id, doc.name)
    media: dict = {"schema": {"$ref": f"#/components/schemas/{component}"}}
    if doc.example is not None:
        media["example"] = doc.example
    headers = [{"name": name, "in": "header", "required": True, "description": text,
                "schema": {"type": "string", "const": doc.name} if name == "X-Broker-Message-Type" else {"type": "string"}}
               for name, text in DELIVERY_HEADERS.items()]
    operation = {
        "operationId": f"webhook_{type_key(channel_id)}_{type_key(doc.name)}",
        "summary": f"{doc.name} (channel {channel_id})",
        "description": doc.description,  # as written: an import of this document gives it back
        "tags": ["webhooks"],
        "deprecated": doc.deprecated,
        "x-event-type": doc.name, "x-channel": channel_id, "x-event-type-version": doc.version,
        "parameters": headers,
        "requestBody": {"required": True, "content": {"application/json": media}},
        "security": [{"webhookSignature": []}],
        "responses": {"2XX": {"description": "delivered"},
                      "410": {"description": "gone: the job is dead, no retry"},
                      "default": {"description": "retried with backoff until maxRetry"}},
    }
    return {"post": operation}, schema_relocated(doc.schema, f"#/components/schemas/{component}")
