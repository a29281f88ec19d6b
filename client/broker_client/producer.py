"""Publishing: one message, batches of up to 1,000, scheduled messages and their cancellation.

Every publish carries a message id, generated here when the caller gives none, before the first
attempt: a retry (after a 429, a 503 or a lost connection) that meets ``409 duplicate_message_id``
is then known to be the earlier attempt's own success, so retrying never publishes twice.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from broker_client.errors import error_from_response
from broker_client.http import Client, RetryPolicy, Transport, path_segment

BATCH_MAX = 1000  # the broker's BROKER_MAX_BATCH_MESSAGES
BATCH_MAX_BYTES = 16 * 1024 * 1024  # keep each batch request well under the broker's body limit


def message_id_new() -> str:
    """A fresh message id (32 hex characters). Ids are opaque to the broker and to this client."""
    return uuid.uuid4().hex


def body_encode(body, content_type: str | None) -> tuple[bytes, str]:
    """The raw bytes and content type of a message body: bytes as given
    (``application/octet-stream``), text as UTF-8 (``text/plain; charset=utf-8``), anything else
    as JSON (``application/json``)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), content_type or "application/octet-stream"
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    return json.dumps(body, separators=(",", ":")).encode("utf-8"), content_type or "application/json"


def header_value(value) -> str | bytes:
    """A header value as ``requests`` sends it: latin-1 text as is, anything else as UTF-8 bytes
    (the broker decodes partition keys and metadata as UTF-8)."""
    text = str(value)
    try:
        text.encode("latin-1")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8")


def rfc3339(value) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("scheduled_for needs a time zone (e.g. datetime.now(timezone.utc))")
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return str(value)


@dataclass
class BatchResult:
    """``message_ids`` in the order given; ``duplicates``: ids the broker already had on the first
    attempt of their chunk (on a retried chunk a duplicate counts as the earlier attempt's own)."""

    message_ids: list[str] = field(default_factory=list)
    created: int = 0
    duplicates: list[str] = field(default_factory=list)


class Producer(Client):
    """Publishes to one channel as one producer.

    >>> p = Producer("http://127.0.0.1:8080", "sample-channel", "sample-channel-token",
    ...              "sample-producer", "sample-producer-token")
    >>> p.publish({"hello": "world"})  # doctest: +SKIP
    '3f0c...'
    """

    def __init__(self, base_url: str, channel: str, channel_token: str, producer_id: str, producer_token: str, *,
                 timeout: float = 30.0, retry: RetryPolicy | None = None, hmac_secret: str | None = None):
        self.channel = channel
        self.transport = Transport(base_url, {
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Producer-ID": producer_id,
            "X-Broker-Producer-Token": producer_token,
        }, timeout=timeout, retry=retry, hmac_secret=hmac_secret)

    def publish(self, body, *, message_id: str | None = None, priority: int = 0, content_type: str | None = None,
                headers: dict | None = None, message_type: str | None = None, partition_key: str | None = None,
                gate: int | None = None, scheduled_for=None) -> str:
        """Publish one message; returns its id. ``headers`` are stored and forwarded to consumers
        (``X-Broker-Metadata-Headers``); ``scheduled_for`` (aware datetime or RFC 3339 text)
        publishes it later. Raises a ``BrokerError`` subclass carrying the broker's code."""
        data, ctype = body_encode(body, content_type)
        mid = message_id or message_id_new()
        request = {name: header_value(value) for name, value in (headers or {}).items()}
        if request:
            request["X-Broker-Metadata-Headers"] = ",".join(request)
        request.update({"Content-Type": ctype, "X-Broker-Message-ID": header_value(mid)})
        if priority:
            request["X-Broker-Message-Priority"] = str(int(priority))
        if message_type is not None:
            request["X-Broker-Message-Type"] = message_type
        if partition_key is not None:
            request["X-Broker-Partition-Key"] = header_value(partition_key)
        if gate is not None:
            request["X-Broker-Gate"] = str(int(gate))
        if scheduled_for is not None:
            request["X-Broker-Scheduled-For"] = rfc3339(scheduled_for)
        path = f"/channel/{path_segment(self.channel)}/broadcast"
        response, retried = self.transport.call("POST", path, data=data, headers=request, accept=(409,))
        if response.status_code == 409:
            error = error_from_response(response)
            if not (retried and error.code == "duplicate_message_id"):
                raise error
        return mid

    def publish_batch(self, items, *, chunk_size: int = BATCH_MAX) -> BatchResult:
        """Publish many messages, each chunk of up to ``chunk_size`` (at most 1,000) in one request
        and one transaction. An item is a body (bytes, text, or a JSON value given as a dict with
        ``body``) or a dict with ``body`` and any of ``message_id``, ``priority``, ``content_type``,
        ``message_type``, ``partition_key``, ``gate``. Bytes must be UTF-8 here (the batch format
        is JSON); publish binary bodies with ``publish``."""
        if not 1 <= chunk_size <= BATCH_MAX:
            raise ValueError(f"chunk_size must be 1..{BATCH_MAX}")
        result = BatchResult()
        chunk: list[dict] = []
        size = 0
        for item in items:
            entry = batch_item(item)
            entry_size = len(json.dumps(entry))
            if chunk and (len(chunk) >= chunk_size or size + entry_size > BATCH_MAX_BYTES):
                self._send_batch(chunk, result)
                chunk, size = [], 0
            chunk.append(entry)
            size += entry_size
        if chunk:
            self._send_batch(chunk, result)
        return result

    def _send_batch(self, chunk: list[dict], result: BatchResult) -> None:
        path = f"/channel/{path_segment(self.channel)}/messages"
        response, retried = self.transport.call("POST", path, json=chunk)
        for answer in response.json()["Result"]:
            result.message_ids.append(answer["MessageID"])
            if answer["Status"] == "created" or retried:
                result.created += 1
            else:
                result.duplicates.append(answer["MessageID"])

    def cancel_scheduled(self, message_id: str) -> None:
        """Cancel a scheduled message before it is dispatched (409 ``already_dispatched`` after;
        404 when unknown, except on a retry: then the earlier attempt cancelled it)."""
        path = f"/channel/{path_segment(self.channel)}/scheduled-message/{path_segment(message_id)}"
        response, retried = self.transport.call("DELETE", path, accept=(404,))
        if response.status_code == 404 and not retried:
            raise error_from_response(response)


def batch_item(item) -> dict:
    """One entry of the batch JSON (``MessageID`` always set, generated when not given)."""
    spec = item if isinstance(item, dict) and "body" in item else {"body": item}
    unknown = set(spec) - {"body", "message_id", "priority", "content_type", "message_type", "partition_key", "gate"}
    if unknown:
        raise ValueError(f"unknown batch item fields: {', '.join(sorted(unknown))}")
    body = spec["body"]
    entry: dict = {"MessageID": spec.get("message_id") or message_id_new()}
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            entry["Payload"] = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("batch payloads must be UTF-8 (the batch format is JSON); "
                             "publish binary bodies one by one with publish()") from None
        entry["ContentType"] = spec.get("content_type") or "application/octet-stream"
    elif isinstance(body, str):
        entry["Payload"] = body
        entry["ContentType"] = spec.get("content_type") or "text/plain; charset=utf-8"
    else:
        entry["Payload"] = body  # stored as JSON by the broker
        entry["ContentType"] = spec.get("content_type") or "application/json"
    if spec.get("priority"):
        entry["Priority"] = int(spec["priority"])
    if spec.get("message_type") is not None:
        entry["Type"] = spec["message_type"]
    if spec.get("partition_key") is not None:
        entry["PartitionKey"] = spec["partition_key"]
    if spec.get("gate") is not None:
        entry["Gate"] = int(spec["gate"])
    return entry
