"""One callback attempt's content: the webhook-broker and Standard Webhooks headers, the
signature, and how an answer is classified. The HTTP exchange itself is in ``jobs.push.http``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from django.conf import settings

RETRY_AFTER_CAP = 24 * 3600.0


@dataclass
class Target:
    """What the dispatcher needs to know about a push consumer (cached per process)."""

    pk: int
    consumer_id: str
    channel_id: str
    url: str
    token: str
    secret: bytes | None
    previous_secret: bytes | None
    previous_expires: float | None  # unix time
    timeout: float
    max_retry: int | None
    backoff: list[float] | None
    rate: float | None
    updated_at: object
    scheme: str = field(init=False)
    host: str = field(init=False)
    port: int = field(init=False)
    path: str = field(init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError:
            port = None
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


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
    mac = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


_RESERVED = {
    "content-type", "content-length", "host", "user-agent", "x-request-id", "x-broker-message-id",
    "x-broker-channel-id", "x-broker-consumer-id", "x-broker-message-priority", "x-broker-metadata-headers",
    "webhook-id", "webhook-timestamp", "webhook-signature", "connection", "transfer-encoding",
    "accept-encoding",
}


def _header_ok(name: str, value: str) -> bool:
    return bool(name) and not any(c in name for c in " :\r\n\t") and "\r" not in value and "\n" not in value


def request_headers(job, target: Target, *, now: float | None = None) -> dict:
    """The callback headers: webhook-broker's, the stored metadata headers and the signature."""
    token_header = settings.BROKER_CONSUMER_TOKEN_HEADER or "X-Broker-Consumer-Token"
    headers = {
        "Content-Type": job.content_type or "application/octet-stream",
        "X-Broker-Message-ID": job.message_id,
        "X-Broker-Channel-ID": target.channel_id,
        "X-Broker-Consumer-ID": target.consumer_id,
        token_header: target.token,
        "X-Broker-Message-Priority": str(job.priority),
        "X-Request-ID": uuid.uuid4().hex,
        "User-Agent": settings.BROKER_USER_AGENT or "Webhook Message Broker",
    }
    metadata = {}
    reserved = _RESERVED | {token_header.lower()}
    for name, value in (job.headers or {}).items():
        value = str(value)
        # A producer's metadata header can never replace the broker's own (e.g. the signature).
        if name.lower() not in reserved and _header_ok(name, value):
            metadata[name] = value
    if metadata:
        headers.update(metadata)
        headers["X-Broker-Metadata-Headers"] = ",".join(sorted(metadata))
    if target.secret:
        stamp = int(now if now is not None else time.time())
        webhook_id = str(job.id)  # the job id: stable across retries, unique per consumer
        signatures = [sign(target.secret, webhook_id, stamp, job.payload)]
        if target.previous_secret and target.previous_expires and target.previous_expires > time.time():
            signatures.append(sign(target.previous_secret, webhook_id, stamp, job.payload))
        headers["webhook-id"] = webhook_id
        headers["webhook-timestamp"] = str(stamp)
        headers["webhook-signature"] = " ".join(signatures)
    return headers


# --- one attempt --------------------------------------------------------------------------------

@dataclass
class Result:
    """What happened to one attempt (recorded in jobs_deliveryattempt)."""

    status_code: int | None
    duration: float  # seconds
    excerpt: str = ""
    error: str = ""
    retry_after: float | None = None
    request_id: str = ""
    finished: float = 0.0  # time.monotonic() at the end

    @property
    def outcome(self) -> str:
        if self.status_code is not None and 200 <= self.status_code < 300:
            return "delivered"
        if self.status_code == 410:
            return "gone"
        if self.error.startswith("timeout"):
            return "timeout"
        if self.status_code is None:
            return "error"
        return "failed"


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


