"""A pulled job: its message, its lease, and the calls that settle it; the states it is settled to
and how one ack answer reads (``answer_error``).

Job ids and message ids are opaque strings (integer strings today, xids after the drop-in
change): never parsed, compared or ordered here.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import datetime, timezone
from functools import lru_cache
from typing import Protocol

from broker_client.errors import JobError

DELIVERED, DEAD, QUEUED = "DELIVERED", "DEAD", "QUEUED"


class JobOwner(Protocol):
    """What a job needs of the consumer that claimed it (``PullConsumer``, a layer above): the
    calls that report its outcome and extend its lease."""

    def outcome_send(self, *, job: Job, state: str, delay: float | None = None, gate: int | None = None,
                     payload=None) -> dict: ...

    def progress_send(self, *, job: Job, seconds: float | None = None, retry=None) -> datetime | None: ...


def answer_error(answer: dict, state: str, retried: bool) -> JobError | None:
    """The ``JobError`` of one ack answer, or None when the outcome stands. A ``conflict`` whose
    job is already in the state asked for (or on a retried request, whose first attempt may have
    landed) is the outcome standing, not an error."""
    code = answer.get("Error")
    if not code:
        return None
    if code == "conflict" and (answer.get("Status") == state or retried):
        return None
    return JobError(str(answer.get("ID")), code, answer.get("Detail", ""), job_status=answer.get("Status"))


@lru_cache(maxsize=256)
def timestamp_parse(value) -> datetime | None:
    """An RFC 3339 time of the broker (``...Z``) as an aware datetime; None when absent. Cached:
    the jobs of one claim share their deadline (one statement, one ``now()``)."""
    if not value:
        return None
    text = str(value)
    if text[-1] in "zZ":
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


class Job:
    """One claimed (INFLIGHT) job. ``payload`` is the message body as bytes; ``attempt`` is 1 on
    the first delivery; ``deadline`` is when the broker takes the job back unless it is settled or
    extended (``progress``). Settle it once with ``ack()``, ``nack(delay=...)``, ``dead()`` or
    ``move_to_gate(...)``."""

    __slots__ = ("id", "message_id", "_payload", "content_type", "priority", "attempt", "deadline",
                 "incremental_timeout", "headers", "partition_key", "gate", "message_type", "pin_id", "receipt", "raw",
                 "_consumer", "_lease_start", "_lease", "_lock", "settled", "lost")

    def __init__(self, item: dict, consumer: JobOwner, *, received: float, server_now: float | None,
                 pin_id: str | None = None):
        message = item.get("Message") or {}
        self.raw = item
        self.id = str(item["ID"])
        self.message_id = str(message.get("MessageID", ""))
        self._payload = None  # decoded on first use (a handler may never read it)
        self.content_type = message.get("ContentType") or "application/octet-stream"
        self.priority = item.get("Priority", 0)
        self.attempt = item.get("Attempt")
        self.deadline = timestamp_parse(item.get("Deadline"))
        self.incremental_timeout = item.get("IncrementalTimeout")
        self.headers = message.get("Headers") or {}
        self.partition_key = item.get("PartitionKey")
        self.gate = item.get("Gate")
        self.message_type = item.get("Type", message.get("Type"))
        self.pin_id = item.get("PinId") or pin_id or None
        # this claim's receipt (opaque): sent with every outcome and progress, so a late one (the
        # lease ran out and another consumer holds the job now) changes nothing (stale_receipt)
        self.receipt = item.get("Receipt")
        self._consumer = consumer
        self._lock = threading.Lock()
        self.settled = False  # an outcome was reported (by the handler or by consume)
        self.lost = False  # the broker no longer holds it for us (deadline passed, progress answered 409)
        self._lease_start = received
        self._lease = self._lease_from(server_now)

    @property
    def payload(self) -> bytes:
        """The message body as bytes (the broker sends text as is and other bytes as base64)."""
        if self._payload is None:
            message = self.raw.get("Message") or {}
            value = message.get("Payload")
            if value is None:
                self._payload = b""
            elif message.get("PayloadEncoding") == "base64":
                self._payload = base64.b64decode(value)
            else:
                self._payload = str(value).encode("utf-8")
        return self._payload

    def _lease_from(self, server_now: float | None) -> float | None:
        """Seconds from receipt to the deadline, on the broker's clock when known (``Date``)."""
        if self.deadline is None:
            return None
        now = server_now if server_now is not None else time.time()
        return max(0.0, self.deadline.timestamp() - now)

    def lease_renewed(self, deadline: datetime | None, *, received: float, server_now: float | None) -> None:
        self.deadline = deadline or self.deadline
        self._lease_start = received
        self._lease = self._lease_from(server_now)

    def progress_due(self, now: float) -> bool:
        """Past half of the lease: time to tell the broker the work goes on."""
        return self._lease is not None and now >= self._lease_start + self._lease / 2

    def text(self, encoding: str = "utf-8") -> str:
        return self.payload.decode(encoding)

    def json(self):
        return json.loads(self.payload)

    def settle_mark(self) -> bool:
        """Claim the right to report this job's outcome: True once, False ever after."""
        with self._lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def _settle(self, state: str, **extra) -> dict:
        if not self.settle_mark():
            raise RuntimeError(f"job {self.id} was already settled")
        try:
            return self._consumer.outcome_send(job=self, state=state, **extra)
        except BaseException:
            with self._lock:
                self.settled = False
            raise

    def ack(self) -> dict:
        """DELIVERED. Raises ``JobError`` (``conflict``) when the broker took the job back."""
        return self._settle(DELIVERED)

    def nack(self, delay: float = 0.0) -> dict:
        """Back to QUEUED (retry + 1), redelivered after ``delay`` seconds; DEAD past the consumer's
        retry limit."""
        return self._settle(QUEUED, delay=delay)

    def dead(self) -> dict:
        """DEAD at once (to the dead-letter queue)."""
        return self._settle(DEAD)

    def move_to_gate(self, gate: int, payload=None) -> dict:
        """Partitions: queue the job at a later ``gate`` of its partition, optionally with a new
        payload (text, or a JSON value)."""
        return self._settle(QUEUED, gate=gate, payload=payload)

    def progress(self, seconds: float | None = None) -> datetime | None:
        """Extend the deadline: now + the broker's base timeout + ``seconds`` (default: the job's
        IncrementalTimeout). Returns the new deadline; raises ``Conflict`` when it is no longer in flight."""
        return self._consumer.progress_send(job=self, seconds=seconds)

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, message_id={self.message_id!r}, attempt={self.attempt}, {len(self.payload)} bytes)"
