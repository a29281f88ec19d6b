"""A test event: one signed POST to a push consumer's callback URL, sent now, its answer handed back
to the caller (the delivery portal's "Send test event"), so a team sees what its endpoint answers
the broker without waiting for a message.

Sent through the push client (``jobs.callbacks.http``: the callback address policy is checked on
the addresses it connects to, no redirect is followed, the answer is bounded) with the push
callbacks' headers and Standard Webhooks signatures: the current secret's and, while a rotation's
grace period lasts, the previous one's. Its ``webhook-id`` is ``test_<random>``, its header
``X-Broker-Event: test``; nothing is recorded as a delivery attempt (no job is involved).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from django.conf import settings

from broker.times import rfc3339
from consumers.models import Consumer
from jobs.callbacks.http import Client, ProtocolError
from jobs.callbacks.signing import secret_bytes, signature_headers
from jobs.callbacks.target import Target

TIMEOUT_CAP = 10.0  # seconds: the page waits for the answer
BODY_HEAD = 1024  # characters of the answer's body shown
_client_lock = threading.Lock()
_clients: dict[str, Client] = {}  # the process's client, made on the first test event


@dataclass(frozen=True)
class ProbeAnswer:
    status_code: int | None  # None: no answer (see ``error``)
    duration_ms: float
    body_head: str
    error: str = ""
    peer: str = ""  # the address that answered

    @property
    def public(self) -> bool:
        """Whether the answer came from a public address. Only then is its body worth showing: an
        endpoint on a private address (allowed by BROKER_CALLBACK_ALLOW, or with the policy off) is
        one of the operator's own services, whose answers are not the team's to read."""
        return address_public(self.peer)


def address_public(address: str) -> bool:
    """A global unicast IP address (an IPv4-mapped IPv6 one as its IPv4 form); False for private,
    loopback, link-local, shared, reserved and anything that is not an address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                                 or ip.is_reserved or ip.is_unspecified)


def _client_shared() -> Client:
    """One client (one event loop thread) per process, started on the first test event."""
    with _client_lock:
        client = _clients["client"] = _clients.get("client") or Client()
        return client


def probe_target(consumer: Consumer) -> Target:
    """The consumer (its channel selected) as the push client addresses it."""
    expires = consumer.previous_secret_expires_at
    timeout = consumer.connection_timeout or settings.BROKER_CONNECTION_TIMEOUT
    return Target(pk=consumer.pk, consumer_id=consumer.consumer_id, channel_id=consumer.channel.channel_id,
                  url=consumer.callback_url, token=consumer.token, secret=secret_bytes(consumer.signing_secret),
                  previous_secret=secret_bytes(consumer.previous_signing_secret),
                  previous_expires=expires.timestamp() if expires else None,
                  timeout=min(float(timeout), TIMEOUT_CAP), max_retry=None, backoff=None, rate=None,
                  updated_at=consumer.updated_at)


def probe_request(target: Target, *, now: float) -> tuple[dict, bytes]:
    """The test event's headers and JSON body (``type`` ``broker.test``), signed as a callback."""
    body = json.dumps({"type": "broker.test", "channel": target.channel_id, "consumer": target.consumer_id,
                       "timestamp": rfc3339(datetime.fromtimestamp(now, timezone.utc))}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-ID": target.channel_id,
        "X-Broker-Consumer-ID": target.consumer_id,
        "X-Broker-Event": "test",
        settings.BROKER_CONSUMER_TOKEN_HEADER or "X-Broker-Consumer-Token": target.token,
        "X-Request-ID": uuid.uuid4().hex,
        "User-Agent": settings.BROKER_USER_AGENT or "Webhook Message Broker",
    }
    keys = [key for key in (target.secret,) if key]
    if target.previous_secret and target.previous_expires and target.previous_expires > now:
        keys.append(target.previous_secret)
    if keys:
        headers.update(signature_headers(keys=keys, webhook_id=f"test_{uuid.uuid4().hex}", timestamp=int(now),
                                         body=body))
    return headers, body


def consumer_test_event_send(*, consumer: Consumer) -> ProbeAnswer:
    """POST a signed test event to the consumer's callback URL now and return its answer: status,
    duration and the head of the body, or the error (refused address, timeout, no HTTP answer)."""
    target = probe_target(consumer)
    headers, body = probe_request(target, now=time.time())
    client = _client_shared()
    started = time.monotonic()
    call = client.post(scheme=target.scheme, host=target.host, port=target.port, path=target.path,
                       headers=headers, body=body, timeout=target.timeout)
    try:
        answer = asyncio.run_coroutine_threadsafe(call, client.loop).result(target.timeout + 1.0)
    except (TimeoutError, OSError, ssl.SSLError, ProtocolError) as exc:
        error = "timeout" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        return ProbeAnswer(None, (time.monotonic() - started) * 1000.0, "", error[:500])
    head = answer.body[:BODY_HEAD * 4].decode("utf-8", "replace")[:BODY_HEAD]
    return ProbeAnswer(answer.status, (time.monotonic() - started) * 1000.0, head, peer=answer.peer)
