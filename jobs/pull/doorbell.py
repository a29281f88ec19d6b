"""The doorbell: a small signed POST to a pull consumer's ``callbackUrl`` when jobs become
available after its queue was empty, at most once per ``notifyInterval`` (default 1 s).

Definition (what "after its queue was empty" means here). Per consumer, in ``DoorbellState``:
- a check that sees no *ready* QUEUED job (``next_attempt_at <= now()``) *arms* the doorbell;
- a check that sees ready jobs rings when the doorbell is armed, or when the consumer has
  drained what it was last rung for: the newest job that was QUEUED at the last ring (``mark``)
  has left QUEUED (pulled, or purged). So a consumer that drains its queue between two checks
  still gets the next ring, and one that does not pull is not rung again however many
  messages arrive;
- and only when ``next_ring_at`` (last ring + notifyInterval) has passed; a ring then disarms,
  records ``mark`` and sets ``next_ring_at`` in the same conditional upsert, so two ringers
  never ring one consumer twice within an interval;
- paused consumers are not rung (a pull would get nothing); resuming notifies, and they ring.
The POST: JSON ``{"channel", "consumer", "NumPending" (QUEUED, from the maintained counters),
"OldestQueuedAt" (creation time of the oldest QUEUED job, RFC 3339)}`` with the push callback
headers (Standard Webhooks signature with the consumer's signing secret, consumer token header)
and ``X-Broker-Event: doorbell``. A changed notifyInterval applies from the next ring.
A failed ring (no 2xx, connection error, timeout) re-arms the doorbell: it is tried again no
sooner than the next interval, and only while jobs are still waiting. It is never retried
otherwise.

Who rings: one ``Ringer`` thread per worker process that runs a push dispatcher loop
(``jobs.tasks.push_dispatch`` starts it), of which the one holding the session advisory lock
``broker-doorbell`` rings (the others wait for the lock: a killed holder frees it with its
connection). It wakes on the ``broker_jobs`` NOTIFY that publishing already sends, on its own
timers (throttled consumers become due) and on a safety-net poll (``BROKER_DOORBELL_POLL``, 1 s),
so publishing pays nothing: no HTTP and no extra statement. POSTs go through their own HTTP
client (its own event loop thread, ``BROKER_DOORBELL_TIMEOUT`` 2 s), fire-and-forget, so a slow
receiver neither blocks checks nor push deliveries.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import select
import ssl
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection

from broker.db.errors import DB_ERRORS
from broker.counters import JOB, counts_for
from broker.db.listen import Listener
from broker.times import rfc3339
from consumers.models import DoorbellState
from jobs.callbacks.http import Client, ProtocolError
from jobs.callbacks.signing import secret_bytes, sign
from jobs.callbacks.target import Target
from jobs.pull.queries import Q
from jobs.publish.wakeup import CHANNEL
from jobs.state.transitions import QUEUED

logger = logging.getLogger("consumers.doorbell")  # its name before the move: what operators filter on
LOCK_KEY = "broker-doorbell"
LOCK_RETRY = 2.0  # seconds between attempts to take the ringer lock
COALESCE = 0.02  # a NOTIFY is followed by this pause so a burst of publishes makes one check
RELOAD_EVERY = 5.0  # the set of doorbell consumers (for filtering NOTIFYs) is reloaded this often
PRUNE_EVERY = 60.0  # doorbell_prune, a step of jobs.housekeeping


def poll_seconds() -> float:
    return max(0.05, float(getattr(settings, "BROKER_DOORBELL_POLL", 1.0)))


def ring_timeout() -> float:
    return max(0.05, float(getattr(settings, "BROKER_DOORBELL_TIMEOUT", 2.0)))


@dataclass
class Ring:
    """One doorbell to send (a consumer just rung by ``doorbell_ring_due``)."""

    consumer_pk: int
    rang_at: datetime
    channel_id: str
    consumer_id: str
    url: str
    token: str
    secret: bytes | None
    previous_secret: bytes | None
    previous_expires: float | None
    oldest_queued_at: datetime | None
    num_pending: int = 0

    def body(self) -> bytes:
        return json.dumps({"channel": self.channel_id, "consumer": self.consumer_id,
                           "NumPending": self.num_pending,
                           "OldestQueuedAt": rfc3339(self.oldest_queued_at)}).encode()

    def headers(self, body: bytes, *, now: float | None = None) -> dict:
        """Standard Webhooks headers signed with the consumer's secret (and the previous one
        during a rotation), as push callbacks (``jobs.push.delivery``)."""
        token_header = settings.BROKER_CONSUMER_TOKEN_HEADER or "X-Broker-Consumer-Token"
        headers = {
            "Content-Type": "application/json",
            "X-Broker-Channel-ID": self.channel_id,
            "X-Broker-Consumer-ID": self.consumer_id,
            "X-Broker-Event": "doorbell",
            token_header: self.token,
            "X-Request-ID": uuid.uuid4().hex,
            "User-Agent": settings.BROKER_USER_AGENT or "Webhook Message Broker",
        }
        if self.secret:
            stamp = int(now if now is not None else time.time())
            webhook_id = f"doorbell_{self.consumer_pk}_{int(self.rang_at.timestamp() * 1000)}"
            signatures = [sign(self.secret, webhook_id, stamp, body)]
            if self.previous_secret and self.previous_expires and self.previous_expires > time.time():
                signatures.append(sign(self.previous_secret, webhook_id, stamp, body))
            headers.update({"webhook-id": webhook_id, "webhook-timestamp": str(stamp),
                            "webhook-signature": " ".join(signatures)})
        return headers


# One statement decides every consumer's doorbell (batched across consumers, time from now()):
# arm the empty ones, ring the due ones (conditional upsert: the WHERE re-checks next_ring_at on
# the locked row, so a concurrent ringer's ring wins and this one returns nothing), and report
# the throttled ones' remaining wait. "ready" is the claim's own probes (the first due first
# attempt, job_push_fresh, or due retry, job_push_retry); mark is one primary-key lookup; the newest
# and oldest QUEUED job come from the job_claim index (consumer, id; LIMIT 1 each, only for
# consumers that ring).
# The statement is ``doorbell_ring`` in jobs/pull/queries.sql.
def doorbell_ring_due(*, consumer_pks=None) -> tuple[list[Ring], list[float]]:
    """Decide and record, in one statement, which pull consumers with a callback URL ring now
    (all of them, or only ``consumer_pks``). Returns the rings to send (with NumPending from the
    maintained counters) and the seconds until each throttled or rung consumer may ring again."""
    ids = None if consumer_pks is None else [int(pk) for pk in consumer_pks]
    with connection.cursor() as cur:
        cur.execute(Q.doorbell_ring.sql, {"ids": ids})
        rows = cur.fetchall()
    rings, waits = [], []
    for (pk, rang_at, channel_id, consumer_id, url, token, secret, previous, previous_expires, oldest,
         wait) in rows:
        if wait is not None:
            waits.append(max(0.0, float(wait)))
        if rang_at is None:
            continue
        rings.append(Ring(
            consumer_pk=pk, rang_at=rang_at, channel_id=channel_id, consumer_id=consumer_id, url=url,
            token=token, secret=secret_bytes(secret), previous_secret=secret_bytes(previous),
            previous_expires=previous_expires.timestamp() if isinstance(previous_expires, datetime) else None,
            oldest_queued_at=oldest,
        ))
    if rings:
        counts = counts_for(scope=JOB, owner_ids=[r.consumer_pk for r in rings])
        for ring in rings:
            ring.num_pending = counts.get(ring.consumer_pk, {}).get(QUEUED, 0)
    return rings, waits


def doorbell_failed(*, failed: list[tuple[int, datetime]]) -> int:
    """Re-arm the doorbells whose ring failed (one statement), unless they rang again since:
    the next check after ``next_ring_at`` rings again if jobs still wait."""
    if not failed:
        return 0
    with connection.cursor() as cur:
        cur.execute(Q.doorbell_failed.sql, [[pk for pk, _ in failed], [at for _, at in failed]])
        return cur.rowcount


def doorbell_prune() -> int:
    """Drop the state of consumers that were deleted or no longer have a doorbell."""
    with connection.cursor() as cur:
        cur.execute(Q.doorbell_prune.sql)
        return cur.rowcount


def doorbell_state(*, consumer_pk: int) -> dict:
    """The doorbell's state for the consumer GET (one primary-key lookup)."""
    state = DoorbellState.objects.filter(consumer_id=consumer_pk).first()
    if state is None:
        return {"Armed": True, "RangAt": None, "Rings": 0, "Failures": 0}
    return {"Armed": state.armed, "RangAt": rfc3339(state.rang_at), "Rings": state.rings,
            "Failures": state.failures}


def doorbell_consumers() -> set[int]:
    with connection.cursor() as cur:
        cur.execute(Q.doorbell_consumers.sql)
        return {row[0] for row in cur.fetchall()}


class Ringer:
    """Checks and rings while it holds the ``broker-doorbell`` lock (see the module docstring)."""

    def __init__(self, *, use_lock: bool = True) -> None:
        self.use_lock = use_lock
        self.client = None
        self.failed: deque = deque()
        self.sent = 0
        self.errors = 0
        self.holding = threading.Event()  # set while this ringer holds the lock and rings
        self.listener = Listener((), application_name="broker-doorbell")  # LISTENs once it holds the lock
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # --- HTTP side (the client's event loop thread) -----------------------------------------
    async def _send(self, ring: Ring) -> None:
        target = Target(pk=ring.consumer_pk, consumer_id=ring.consumer_id, channel_id=ring.channel_id,
                                 url=ring.url, token=ring.token, secret=None, previous_secret=None,
                                 previous_expires=None, timeout=ring_timeout(), max_retry=None, backoff=None,
                                 rate=None, updated_at=None)
        started = time.monotonic()
        error, code = "", None
        try:
            body = ring.body()
            answer = await self.client.post(scheme=target.scheme, host=target.host, port=target.port,
                                            path=target.path, headers=ring.headers(body), body=body,
                                            timeout=target.timeout)
            code = answer.status
            if not 200 <= code < 300:
                error = f"status {code}"
        except TimeoutError:
            error = f"timeout after {target.timeout:g}s"
        except (OSError, ssl.SSLError, ProtocolError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001 - a bug in one ring must not stop the others
            if self.stopping:
                return  # the ringer is shutting down: this ring dies with its event loop
            logger.exception("doorbell of consumer %s failed unexpectedly", ring.consumer_pk)
            error = f"internal error: {type(exc).__name__}"
        duration_ms = round((time.monotonic() - started) * 1000.0, 1)
        if error:
            self.errors += 1
            logger.warning("doorbell failed: %s", error, extra={
                "consumer_pk": ring.consumer_pk, "consumer_id": ring.consumer_id, "channel_id": ring.channel_id,
                "status_code": code, "duration_ms": duration_ms, "outcome": "doorbell_failed"})
            self.failed.append((ring.consumer_pk, ring.rang_at))
            self.wake()
        else:
            self.sent += 1

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # --- the loop (its own thread) --------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: take the lock, then check and ring; on any database error start over."""
        self.client = Client()
        down = False  # a database outage is logged once, not every second
        try:
            while not stop.is_set():
                try:
                    self._session(stop)
                    down = False
                except DB_ERRORS as exc:  # a restart, a cut connection, a failover
                    if not down:
                        logger.warning("doorbell ringer: database unavailable (%s); starting over every 1 s",
                                       type(exc).__name__)
                    down = True
                    stop.wait(1.0)
                except Exception:  # noqa: BLE001 - keep ringing after anything
                    logger.exception("doorbell ringer failed; restarting in 1 s")
                    stop.wait(1.0)
                finally:
                    self.holding.clear()
                    connection.close()
        finally:
            self.stopping = True
            self._cancel_sends()
            self.client.stop()

    def _cancel_sends(self) -> None:
        """Rings still in flight at shutdown are dropped (cancelled, then the loop stops)."""
        loop = self.client.loop
        if loop.is_running():
            loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(loop)])
            time.sleep(0.1)

    def _session(self, stop: threading.Event) -> None:
        """One connection holds the lock (tried again every ``LOCK_RETRY`` s on the same
        connection while another ringer has it), then LISTENs (never before: a connection that
        listens without reading would hold back the server's notification queue); checks run on
        Django's connection. A lost connection ends the session; the next one comes after the
        listener's backoff."""
        conn = self.listener.connect()
        if conn is None:
            stop.wait(max(0.05, self.listener.retry_at - time.monotonic()))
            return
        try:
            while self.use_lock and not stop.is_set():
                if conn.execute(Q.doorbell_lock.sql, [LOCK_KEY]).fetchone()[0]:
                    break
                stop.wait(LOCK_RETRY)
            if stop.is_set():
                return
            self.listener.listen(CHANNEL)
            self.holding.set()
            self._loop(conn, stop)
        finally:
            self.listener.close()

    def _loop(self, conn, stop: threading.Event) -> None:
        poll = poll_seconds()
        timers: list[float] = []
        members: set[int] = set()
        members_at = -RELOAD_EVERY
        next_poll = 0.0  # a full check at once
        notified: set[int] = set()
        while not stop.is_set():
            now = time.monotonic()
            if now - members_at >= RELOAD_EVERY:
                members, members_at = doorbell_consumers(), now
            full = now >= next_poll and bool(members)  # no doorbell consumer: nothing to check
            if now >= next_poll and not members:
                next_poll = now + poll
            while timers and timers[0] <= now:
                heapq.heappop(timers)
                full = True
            ids = notified & members
            notified = set()
            if full or ids:
                rings, waits = doorbell_ring_due(consumer_pks=None if full else ids)
                if full:
                    next_poll = now + poll
                for wait in waits:
                    at = round((now + wait) * 20) / 20 + 0.05  # 50 ms buckets: one timer per burst
                    if at not in timers:
                        heapq.heappush(timers, at)
                if rings:
                    self.client.submit(rings, self._send)
            if self.failed:
                failed = []
                while self.failed:
                    failed.append(self.failed.popleft())
                doorbell_failed(failed=failed)
            wait_until = min([next_poll, *timers[:1]])
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(max(0.0, wait_until - time.monotonic()) * 1000.0)}
            if self._wake_r in ready:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if conn.fileno() in ready:
                notified = self.listener.drain()
                if notified and notified & members:
                    stop.wait(COALESCE)  # let the rest of a burst arrive: one check for all of it
                    more = self.listener.drain()
                    notified = None if more is None else notified | more
                if notified is None:
                    return  # connection lost: a new session (lock, LISTEN) after the backoff

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def doorbell_thread_start() -> bool:
    """Start this process's ringer thread once (idempotent); it rings while it holds the lock.
    Called by every push dispatcher task, so a worker cluster always has a ringer candidate.
    ``BROKER_DOORBELL_POLL`` = 0 (or less) disables the doorbell."""
    global _thread
    if float(getattr(settings, "BROKER_DOORBELL_POLL", 1.0)) <= 0:
        return False
    with _thread_lock:
        if _thread is not None and _thread.is_alive():
            return False
        ringer = Ringer()
        _thread = threading.Thread(target=ringer.run, args=(threading.Event(),), name="broker-doorbell",
                                   daemon=True)
        _thread.start()
        return True
