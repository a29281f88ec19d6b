"""Standard Webhooks signing of a callback: the ``whsec_`` secret as key bytes and the v1 signature
of ``id.timestamp.body``. Push deliveries and doorbell rings are signed alike."""

from __future__ import annotations

import base64
import hmac


def secret_bytes(secret: str | None) -> bytes | None:
    """A ``whsec_`` secret as key bytes (base64 after the prefix), as the standardwebhooks package."""
    if not secret:
        return None
    raw = secret[6:] if secret.startswith("whsec_") else secret
    try:
        return base64.b64decode(raw + "==") or None
    except ValueError:
        return None


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks v1: base64 HMAC-SHA256 of ``id.timestamp.body``."""
    mac = hmac.digest(key, f"{webhook_id}.{timestamp}.".encode() + body, "sha256")  # one-shot: OpenSSL in one call
    return "v1," + base64.b64encode(mac).decode()


def signature_headers(*, keys: list[bytes], webhook_id: str, timestamp: int, body: bytes) -> dict:
    """The Standard Webhooks headers of one message: a ``v1,`` signature per key, space-separated
    (the current secret and, while a rotation's grace period lasts, the previous one: a receiver
    accepts the message when any of them verifies with its secret)."""
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(sign(key, webhook_id, timestamp, body) for key in keys)}
