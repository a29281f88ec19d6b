"""Receiving push callbacks and doorbells: Standard Webhooks verification and a small WSGI app.

The broker signs every callback and doorbell with the consumer's ``whsec_`` secret
(``webhook-id``, ``webhook-timestamp``, ``webhook-signature: v1,<base64> [v1,<base64>]``). After a
secret rotation it sends both signatures for the grace period, so a receiver still configured with
the old secret, or already with the new one, verifies either way; a receiver can also be given
both secrets while it is being switched over.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time

import standardwebhooks

from broker_client.errors import WebhookVerificationError

logger = logging.getLogger("broker_client")

TOLERANCE = 5 * 60  # seconds; the standardwebhooks package's fixed tolerance


def _secrets(secret) -> list:
    items = [secret] if isinstance(secret, (str, bytes)) else list(secret or [])
    if not items or not all(items):
        raise ValueError("a webhook secret is required")
    return items


def _headers(headers) -> dict:
    return {str(k).lower(): v for k, v in dict(headers).items()}


def _key(secret) -> bytes:
    """A ``whsec_`` secret's key bytes, decoded as the standardwebhooks package decodes them."""
    if isinstance(secret, bytes):
        return secret
    raw = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    return base64.b64decode(raw + "==")


def _verify_binary(key: bytes, headers: dict, body: bytes) -> bool:
    """Standard Webhooks for a body that is not UTF-8 (the package only signs text): the same
    HMAC-SHA256 over ``id.timestamp.body`` bytes and the same tolerance."""
    stamp = headers["webhook-timestamp"]
    if abs(time.time() - float(stamp)) > TOLERANCE:
        return False
    expected = hmac.new(key, f"{headers['webhook-id']}.{stamp}.".encode() + body, hashlib.sha256).digest()
    for part in headers["webhook-signature"].split(" "):
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(expected, base64.b64decode(sig)):
            return True
    return False


def verify_webhook(headers, body: bytes, secret) -> None:
    """Verify a callback or doorbell of the broker. ``secret``: the consumer's ``whsec_...``
    signing secret, or several (old and new, during a rotation): any one matching is enough.
    Raises ``WebhookVerificationError`` (missing headers, timestamp more than 5 minutes off, no
    matching signature); returns None when the request is genuine."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    lowered = _headers(headers)
    if not all(lowered.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature")):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    for item in _secrets(secret):
        try:
            hook = standardwebhooks.Webhook(item)
            if text is not None:
                hook.verify(text, lowered, json_parse=False)
                return None
            if _verify_binary(_key(item), lowered, bytes(body)):
                return None
        except standardwebhooks.WebhookVerificationError as exc:
            last = str(exc)
            continue
        except (ValueError, TypeError, KeyError) as exc:  # malformed signature list or timestamp
            last = f"malformed signature headers: {exc}"
            continue
        else:
            last = "No matching signature found"
    raise WebhookVerificationError(last)


class WebhookRequest:
    """One verified callback: ``body`` (bytes), ``headers`` (lower-case names), and the broker's
    fields: ``job_id`` (``webhook-id``), ``message_id``, ``channel``, ``consumer``, ``priority``,
    ``event`` (``"doorbell"`` for a doorbell, else ``"message"``), ``partition_key``, ``gate``."""

    def __init__(self, headers: dict, body: bytes):
        self.headers = headers
        self.body = body
        self.job_id = headers.get("webhook-id")
        self.message_id = headers.get("x-broker-message-id")
        self.channel = headers.get("x-broker-channel-id")
        self.consumer = headers.get("x-broker-consumer-id")
        self.priority = int(headers.get("x-broker-message-priority") or 0)
        self.event = headers.get("x-broker-event") or "message"
        self.partition_key = headers.get("x-broker-partition-key")
        gate = headers.get("x-broker-gate")
        self.gate = int(gate) if gate not in (None, "") else None
        self.content_type = headers.get("content-type", "application/octet-stream")

    def json(self):
        return json.loads(self.body)


def _wsgi_headers(environ) -> dict:
    headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers[key.replace("_", "-").lower()] = environ[key]
    return headers


def webhook_app(handler, secret, *, max_body: int = 64 * 1024 * 1024):
    """A WSGI application for a push receiver (serve it with any WSGI server). Every request is
    verified first (401 when the signature does not hold); ``handler(request)`` then answers:
    None -> 204 (delivered); a dict -> 200 with it as JSON (e.g. ``{"gate": 2, "done": False,
    "data": {...}}`` for partitions); an exception -> 500 (the broker retries with backoff)."""

    def app(environ, start_response):
        def answer(status: str, body: bytes = b"", content_type: str = "application/json"):
            headers = [("Content-Length", str(len(body)))]
            if body:
                headers.append(("Content-Type", content_type))
            start_response(status, headers)
            return [body]

        if environ.get("REQUEST_METHOD") != "POST":
            return answer("405 Method Not Allowed", b'{"error": "method_not_allowed"}')
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= max_body:
            return answer("413 Payload Too Large", b'{"error": "payload_too_large"}')
        body = environ["wsgi.input"].read(length) if length else b""
        headers = _wsgi_headers(environ)
        try:
            verify_webhook(headers, body, secret)
        except WebhookVerificationError as exc:
            logger.warning("webhook refused: %s", exc)
            return answer("401 Unauthorized", json.dumps({"error": "invalid_signature", "detail": str(exc)}).encode())
        try:
            result = handler(WebhookRequest(headers, body))
        except Exception as exc:  # noqa: BLE001 - the broker retries a 5xx
            logger.warning("webhook handler failed on job %s: %r", headers.get("webhook-id"), exc, exc_info=True)
            return answer("500 Internal Server Error", b'{"error": "handler_failed"}')
        if result is None:
            return answer("204 No Content")
        return answer("200 OK", json.dumps(result).encode())

    return app
