"""Where a callback goes and how: a consumer's URL (split once), token, signing secrets (the current
and, while a rotation lasts, the previous one), timeout and retry policy; cached per process."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit


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
