"""Where a callback goes and how: a consumer's URL (split once), token, signing secrets (the current
and, while a rotation lasts, the previous one), timeout and retry policy; cached per process."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings

# Headers only the broker sets on a callback: a producer's metadata header of one of these names is
# not forwarded (the consumer token's header, a setting, is added per target).
RESERVED_HEADERS = frozenset({
    "content-type", "content-length", "host", "user-agent", "x-request-id", "x-broker-message-id",
    "x-broker-channel-id", "x-broker-consumer-id", "x-broker-message-priority", "x-broker-metadata-headers",
    "webhook-id", "webhook-timestamp", "webhook-signature", "connection", "transfer-encoding",
    "accept-encoding", "x-broker-message-type", "traceparent", "tracestate",
})


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
    # the settings a callback's headers need, read once per target (not once per callback)
    token_header: str = field(init=False)
    user_agent: str = field(init=False)
    reserved: frozenset = field(init=False)  # RESERVED_HEADERS and the token header, lower case

    def __post_init__(self) -> None:
        self.token_header = settings.BROKER_CONSUMER_TOKEN_HEADER or "X-Broker-Consumer-Token"
        self.user_agent = settings.BROKER_USER_AGENT or "Webhook Message Broker"
        self.reserved = RESERVED_HEADERS | {self.token_header.lower()}
        parts = urlsplit(self.url)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError:
            port = None
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
