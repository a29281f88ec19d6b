"""One callback attempt: its content (the webhook-broker and Standard Webhooks headers), the attempt
itself (``attempt_deliver``, on the dispatcher's HTTP client) and how an answer is classified
(``Result``; a partition handler's JSON answer, ``handler_answer``). The HTTP exchange is
``jobs.callbacks.http``, the signature ``jobs.callbacks.signing``."""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import time
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from broker.tracing import span_start, traceparent_child
from broker.xid import job_xid
from jobs.callbacks.http import ProtocolError
from jobs.callbacks.signing import secret_bytes, sign
from jobs.callbacks.target import Target
from jobs.push.queries import Q

logger = logging.getLogger("jobs.push.dispatcher")  # the name operators filter push delivery logs on
RETRY_AFTER_CAP = 24 * 3600.0


_BAD_NAME = re.compile(r"[ :\r\n\t]")
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))  # version and variant bits of a UUID (RFC 9562)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def request_id() -> str:
    """A random (version 4) UUID in hex, as ``uuid.uuid4().hex`` writes it, without the UUID object."""
    return "%032x" % ((int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR) | _UUID4_SET)


def _header_ok(name: str, value: str) -> bool:
    return bool(name) and not _BAD_NAME.search(name) and "\r" not in value and "\n" not in value


_KEY_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")  # printable ASCII as-is


def request_headers(job, target: Target, *, now: float | None = None, worker: str = "", span=None) -> dict:
    """The callback headers: webhook-broker's, the stored metadata headers, the trace context (the
    message's trace id, a span id of this attempt's own: ``span``'s when OpenTelemetry records one)
    and the signature."""
    headers = {
        "Content-Type": job.content_type or "application/octet-stream",
        "X-Broker-Message-ID": job.message_id,
        "X-Broker-Channel-ID": target.channel_id,
        "X-Broker-Consumer-ID": target.consumer_id,
        target.token_header: target.token,
        "X-Broker-Message-Priority": str(job.priority),
        "X-Request-ID": request_id(),
        "User-Agent": target.user_agent,
    }
    if job.headers:
        reserved, forwarded = target.reserved, []
        for name, value in job.headers.items():
            value = str(value)
            # A producer's metadata header can never replace the broker's own (e.g. the signature).
            if name.lower() not in reserved and _header_ok(name, value):
                headers[name] = value
                forwarded.append(name)
        if forwarded:
            headers["X-Broker-Metadata-Headers"] = ",".join(sorted(forwarded))
    trace = getattr(job, "trace", None)
    headers["traceparent"] = traceparent_child(trace.traceparent if trace else "", span)
    if trace is not None and trace.tracestate:
        headers["tracestate"] = trace.tracestate
    message_type = getattr(job, "message_type", None)
    if message_type is not None:  # filters: the type the consumer's messageTypes matched
        headers["X-Broker-Message-Type"] = message_type
    partition_key = getattr(job, "partition_key", None)
    if partition_key is not None:  # jobs.partitions: where the job stands, so a handler can answer a gate
        headers["X-Broker-Partition-Key"] = quote(partition_key, safe=_KEY_SAFE)
        headers["X-Broker-Gate"] = str(job.gate)
        if worker:
            headers["X-Broker-Lease-Owner"] = worker
    if target.secret:
        stamp = int(now if now is not None else time.time())
        webhook_id = job_xid(job.id)  # the job ID: stable across retries, unique per consumer
        signatures = [sign(target.secret, webhook_id, stamp, job.payload)]
        if target.previous_secret and target.previous_expires and target.previous_expires > time.time():
            signatures.append(sign(target.previous_secret, webhook_id, stamp, job.payload))
        headers["webhook-id"] = webhook_id
        headers["webhook-timestamp"] = str(stamp)
        headers["webhook-signature"] = " ".join(signatures)
    return headers


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
    answer: "HandlerAnswer | None" = None  # partitioned jobs: the handler's JSON answer

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


@dataclass
class HandlerAnswer:
    """What a 2xx JSON body asks for: ``move`` to ``gate`` with ``payload`` (None keeps the job's
    payload), or ``error`` (a failed attempt; ``no_retry``: dead at once)."""

    move: bool = False
    gate: int = 0
    payload: bytes | None = None
    error: str = ""
    no_retry: bool = False


def handler_answer(body: bytes, current_gate: int) -> HandlerAnswer | None:
    """The state processor's answer ``{"gate": n, "done": bool, "data": {...}}`` (also ``complete``
    for ``done``, ``response`` for ``data``, ``"error": {"message", "no_retry"}``). None: deliver
    (no JSON object, ``done`` true, or neither ``done`` nor ``gate``). ``done`` false (or absent
    with a ``gate``) moves the job to ``gate``, which must be an integer above the current gate;
    anything else is a bad answer, treated as a failed attempt with a clear error."""
    text = body.strip()
    if not text.startswith(b"{"):
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    if err:
        if isinstance(err, dict):
            message = str(err.get("message") or "handler error")
            no_retry = err.get("no_retry", err.get("noRetry")) is True
        else:
            message, no_retry = str(err), False
        return HandlerAnswer(error=f"handler error: {message}"[:500], no_retry=no_retry)
    done = doc.get("done", doc.get("complete"))
    if done is True or (done is None and "gate" not in doc):
        return None
    if done is not None and not isinstance(done, bool):
        return HandlerAnswer(error="bad handler answer: done must be a boolean")
    gate = doc.get("gate")
    if isinstance(gate, bool) or not isinstance(gate, int) or gate <= current_gate or gate > 2**31 - 1:
        return HandlerAnswer(error=f"bad handler answer: gate must be an integer above the current gate "
                                   f"{current_gate} (got {gate!r})")
    data = doc.get("data", doc.get("response"))
    if data is None:
        payload = None
    elif isinstance(data, str):
        payload = data.encode("utf-8", "surrogatepass")
    else:
        payload = json.dumps(data, separators=(",", ":")).encode()
    return HandlerAnswer(move=True, gate=gate, payload=payload)


def targets_load(pks) -> dict[int, Target]:
    """Push consumers by pk, as the callbacks need them."""
    with connection.cursor() as cur:
        cur.execute(Q.push_targets.sql, [list(pks)])
        rows = cur.fetchall()
    targets = {}
    for (pk, consumer_id, channel_id, url, token, secret, previous, previous_expires, timeout, max_retry,
         backoff, rate, updated_at) in rows:
        steps = None
        if backoff:
            try:
                steps = [float(x) for x in backoff.split(",") if x.strip()] or None
            except ValueError:
                steps = None
        targets[pk] = Target(
            pk=pk, consumer_id=consumer_id, channel_id=channel_id, url=url, token=token,
            secret=secret_bytes(secret), previous_secret=secret_bytes(previous),
            previous_expires=previous_expires.timestamp() if isinstance(previous_expires, datetime) else None,
            timeout=float(timeout if timeout is not None else settings.BROKER_CONNECTION_TIMEOUT),
            max_retry=max_retry, backoff=steps, rate=rate, updated_at=updated_at,
        )
    return targets


async def attempt_deliver(client, job, target: Target, *, worker: str) -> "Result":
    """POST one claimed job to its consumer and classify the answer; never raises (a failure is the
    attempt's outcome). Runs on the dispatcher's event loop (``client``: ``jobs.callbacks.http``)."""
    started = time.monotonic()
    headers = {}
    span = span_start(f"deliver {target.channel_id}", parent=job.trace, kind="client", attributes={
        "messaging.system": "broker", "messaging.operation.type": "process", "messaging.message.id": job.message_id,
        "messaging.destination.name": target.channel_id, "messaging.consumer.group.name": target.consumer_id,
        "broker.attempt": job.retry_count + 1}) if settings.OTEL_TRACING else None  # only when OpenTelemetry is configured
    try:
        headers = request_headers(job, target, worker=worker, span=span)
        answer = await client.post(scheme=target.scheme, host=target.host, port=target.port,
                                   path=target.path, headers=headers, body=job.payload, timeout=target.timeout)
        code = answer.status
        retry_after = (parse_retry_after(answer.headers.get("retry-after"))
                       if code in (429, 503) else None)
        location = answer.headers.get("location") if 300 <= code < 400 else None
        error = f"redirect to {location} not followed" if location else ""
        excerpt = answer.body[:settings.BROKER_PUSH_EXCERPT_BYTES].decode("utf-8", "replace") if answer.body else ""
        result = Result(status_code=code, duration=0.0, excerpt=excerpt, error=error, retry_after=retry_after)
        if job.partition_key is not None and 200 <= code < 300:  # handler-driven gates
            result.answer = handler_answer(answer.body, job.gate)
    except TimeoutError:
        result = Result(status_code=None, duration=0.0, error=f"timeout after {target.timeout:g}s")
    except (OSError, ssl.SSLError, ProtocolError, ValueError) as exc:
        result = Result(status_code=None, duration=0.0, error=f"{type(exc).__name__}: {exc}"[:500])
    except Exception as exc:  # noqa: BLE001 - a bug must not lose the job's outcome
        logger.exception("push delivery of job %s failed unexpectedly", job_xid(job.id), extra={
            "job_id": job_xid(job.id), "message_id": job.message_id, "consumer_id": target.consumer_id,
            "channel_id": target.channel_id})
        result = Result(status_code=None, duration=0.0, error=f"internal error: {type(exc).__name__}")
    end = time.monotonic()
    result.duration, result.finished, result.request_id = end - started, end, headers.get("X-Request-ID", "")
    if span is not None:
        span.end(error="" if result.outcome == "delivered" else (result.error or f"HTTP {result.status_code}"),
                 **{"http.response.status_code": result.status_code, "broker.outcome": result.outcome})
    return result
