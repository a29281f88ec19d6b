"""A pull consumer: long-polling pulls, batch acks, progress, priority groups and pins.

The protocol (README "Pull consumers" and "Priority groups"):

- ``POST .../pull`` claims up to ``batch`` jobs (INFLIGHT, each with ``Attempt`` and ``Deadline``),
  waiting up to ``expires`` seconds for the first; on a consumer with a priority policy the broker
  collects jobs until the batch is full or ``expires`` ends.
- ``POST .../ack`` settles up to 1,000 jobs in one statement, answered per job.
- ``POST .../job/{id}/progress`` moves an in-flight job's deadline.
- ``pinned_client``: answers carry ``X-Broker-Pin-Id``; later pulls send it as ``id``; a 423
  (``pin_id_mismatch`` at once, ``wrong_pin_id`` when a job is dispatched) means the pin moved:
  drop the id and pull again (as a standby).
"""

from __future__ import annotations

import logging
import threading
import time

from broker_client.consume import ConsumeLoop
from broker_client.errors import PinMismatch, error_from_response
from broker_client.http import Client, RetryPolicy, Transport, path_segment, server_time
from broker_client.jobs import DEAD, DELIVERED, QUEUED, Job, answer_error, timestamp_parse

logger = logging.getLogger("broker_client")

PULL_BATCH_MAX = 1000
PULL_EXPIRES_MAX = 60.0
ACK_MAX = 1000
LONG_POLL_MARGIN = 15.0  # seconds of read timeout beyond ``expires``
PINNED = "pinned_client"


class PullConsumer(Client):
    """One pull consumer of a channel. Thread-safe: each thread gets its own HTTP session.

    ``group`` (and, by the consumer's policy, ``priority``, ``min_pending``, ``min_ack_pending``)
    go with every pull; ``incremental_timeout`` lengthens each claimed job's deadline."""

    def __init__(self, base_url: str, channel: str, consumer: str, channel_token: str, consumer_token: str, *,
                 group: str | None = None, priority: int | None = None, min_pending: int | None = None,
                 min_ack_pending: int | None = None, incremental_timeout: float | None = None,
                 timeout: float = 30.0, retry: RetryPolicy | None = None, hmac_secret: str | None = None):
        self.channel = channel
        self.consumer = consumer
        self.group = group
        self.priority = priority
        self.min_pending = min_pending
        self.min_ack_pending = min_ack_pending
        self.incremental_timeout = incremental_timeout
        self.transport = Transport(base_url, {
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Consumer-Token": consumer_token,
        }, timeout=timeout, retry=retry, hmac_secret=hmac_secret)
        self.path = f"/channel/{path_segment(channel)}/consumer/{path_segment(consumer)}"
        self._pin: str | None = None
        self._pin_lock = threading.Lock()
        self._policy: tuple[str, float | None] | None = None
        self.stopping = threading.Event()

    # --- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask a running ``consume`` to stop pulling, finish the jobs in hand and return (safe from
        any thread or a signal handler). From another thread it takes effect when the current
        long-poll answers (at most ``expires``); SIGTERM interrupts the long-poll at once."""
        self.stopping.set()

    @property
    def pin_id(self) -> str | None:
        """The pin id this client holds (``pinned_client`` consumers), None when not pinned."""
        return self._pin

    # --- pulling ---------------------------------------------------------------------------------

    def fetch(self, batch: int = 1, expires: float = 30.0, *, no_wait: bool = False,
              max_bytes: int | None = None) -> list[Job]:
        """Claim up to ``batch`` jobs, waiting up to ``expires`` seconds for the first (0: answer at
        once). Follows the pin protocol: keeps the pin id it is given, and on a 423 drops it and
        pulls again without it."""
        return self.pull_send(batch=batch, expires=expires, no_wait=no_wait, max_bytes=max_bytes)

    def pull_send(self, *, batch: int, expires: float, no_wait: bool = False, max_bytes: int | None = None,
                  wait=None) -> list[Job]:
        """POST .../pull until jobs come or ``expires`` is used up: one request, or on a
        ``pinned_client`` consumer several of at most half its ``priorityTimeout`` each (each pull
        carrying the pin id renews the pin; one long wait would let it lapse)."""
        if not 1 <= batch <= PULL_BATCH_MAX:
            raise ValueError(f"batch must be 1..{PULL_BATCH_MAX}")
        expires = min(max(0.0, float(expires)), PULL_EXPIRES_MAX)
        end = time.monotonic() + expires
        slice_max = self.pull_slice()
        while True:
            remaining = max(0.0, end - time.monotonic())
            jobs = self.pull_once(batch=batch, expires=min(remaining, slice_max), no_wait=no_wait,
                                  max_bytes=max_bytes, wait=wait)
            if jobs or no_wait or end - time.monotonic() <= 0.05 or self.stopping.is_set():
                return jobs

    def pull_once(self, *, batch: int, expires: float, no_wait: bool, max_bytes: int | None, wait) -> list[Job]:
        for _ in range(2):
            body: dict = {"batch": batch, "expires": round(expires, 3)}
            if no_wait:
                body["no_wait"] = True
            if max_bytes is not None:
                body["max_bytes"] = max_bytes
            incremental = self.incremental_timeout or 0
            if self.group is not None:
                body["group"] = self.group
                # with a priority policy the broker holds claimed jobs until the batch is full or
                # the wait ends: their lease must outlast the wait
                incremental = max(incremental, expires if not no_wait else 0)
            if incremental:
                body["IncrementalTimeout"] = incremental
            for name in ("priority", "min_pending", "min_ack_pending"):
                value = getattr(self, name)
                if value is not None:
                    body[name] = value
            pin = self._pin
            if pin:
                body["id"] = pin
            timeout = (min(10.0, self.transport.timeout), expires + LONG_POLL_MARGIN)
            response, _ = self.transport.call("POST", f"{self.path}/pull", json=body, timeout=timeout,
                                              accept=(423,), wait=wait)
            if response.status_code == 423:
                if not pin:
                    raise error_from_response(response)
                self.pin_drop(pin, error_from_response(response))
                continue  # the protocol: clear the id and pull again, as a standby
            return self.jobs_parse(response)
        raise PinMismatch(423, "pin_id_mismatch", "the pin moved twice in a row")

    def jobs_parse(self, response) -> list[Job]:
        received = time.monotonic()
        now = server_time(response)
        data = response.json()
        pin = response.headers.get("X-Broker-Pin-Id") or data.get("PinId")
        if pin and data.get("Result"):
            self.pin_take(pin)
        return [Job(item, self, received=received, server_now=now, pin_id=pin) for item in data.get("Result") or []]

    def pin_take(self, pin: str) -> None:
        with self._pin_lock:
            if pin != self._pin:
                logger.info("pinned: consumer %s group %s pin id %s", self.consumer, self.group, pin)
                self._pin = pin

    def pin_drop(self, pin: str, error) -> None:
        with self._pin_lock:
            if self._pin == pin:
                logger.info("pin lost (%s): consumer %s group %s pin id %s", error.code, self.consumer,
                            self.group, pin)
                self._pin = None

    def pull_slice(self) -> float:
        """The longest single long-poll: half of ``priorityTimeout`` on a ``pinned_client``
        consumer (read once from the consumer's settings), else the broker's maximum."""
        if self.group is None:
            return PULL_EXPIRES_MAX
        if self._policy is None:
            try:
                info = self.stats()
                self._policy = (info.get("PriorityPolicy") or "none", info.get("PriorityTimeout"))
            except Exception as exc:  # noqa: BLE001 - the slice is an optimisation; pulls report errors
                logger.debug("consumer settings not readable: %r", exc)
                return PULL_EXPIRES_MAX
        policy, pin_timeout = self._policy
        if policy == PINNED and pin_timeout:
            return max(1.0, float(pin_timeout) / 2)
        return PULL_EXPIRES_MAX

    # --- settling --------------------------------------------------------------------------------

    def ack_many(self, outcomes, *, wait=None) -> list[dict]:
        """Report many outcomes in one request per 1,000: items of (job or job id, state[, delay])
        with state DELIVERED, DEAD or QUEUED (delay: seconds before redelivery). Returns the
        broker's per-job answers (``{"ID", "Status", "RetryCount"}`` or with ``"Error"``)."""
        items = []
        for outcome in outcomes:
            job, state, *rest = outcome
            item = {"ID": job.id if isinstance(job, Job) else str(job), "NextState": state}
            if isinstance(job, Job) and job.receipt is not None:
                item["Receipt"] = job.receipt
            if rest and rest[0] is not None and state == QUEUED:
                item["Delay"] = rest[0]
            items.append(item)
        return self.ack_send(items, wait=wait)[0]

    def ack_send(self, items: list[dict], *, wait=None) -> tuple[list[dict], bool]:
        """POST .../ack in chunks of 1,000; returns (answers, whether any chunk was retried)."""
        answers, retried = [], False
        for start in range(0, len(items), ACK_MAX):
            response, tries = self.transport.call("POST", f"{self.path}/ack", json={"Jobs": items[start:start + ACK_MAX]},
                                                  wait=wait)
            answers.extend(response.json()["Result"])
            retried = retried or tries > 0
        return answers, retried

    def outcome_send(self, *, job: Job, state: str, delay: float | None = None, gate: int | None = None,
                     payload=None) -> dict:
        item: dict = {"ID": job.id, "NextState": state}
        if job.receipt is not None:
            item["Receipt"] = job.receipt
        if gate is not None:
            item["Gate"] = int(gate)
            if payload is not None:
                item["Payload"] = payload
        elif state == QUEUED and delay:
            item["Delay"] = delay
        [answer], retried = self.ack_send([item])
        error = answer_error(answer, state, retried)
        if error is not None:
            raise error
        return answer

    def progress_send(self, *, job: Job, seconds: float | None = None, retry: RetryPolicy | None = None):
        """POST .../job/{id}/progress; the job's lease is renewed from the answer. A job that is no
        longer in flight is marked ``lost`` (and ``Conflict`` raised)."""
        body: dict = {"IncrementalTimeout": seconds} if seconds else {}
        if job.receipt is not None:
            body["Receipt"] = job.receipt
        try:
            response, _ = self.transport.call("POST", f"{self.path}/job/{path_segment(job.id)}/progress", json=body,
                                              retry=retry)
        except Exception as exc:
            if getattr(exc, "status", None) in (404, 409):
                job.lost = True
            raise
        job.lease_renewed(timestamp_parse(response.json().get("Deadline")), received=time.monotonic(),
                          server_now=server_time(response))
        return job.deadline

    # --- priority groups and statistics ----------------------------------------------------------

    def unpin(self, group: str | None = None) -> dict:
        """Release the pin of ``group`` (default: this consumer's group); the next job pins another
        waiting pull. Returns ``{"Group", "Unpinned", "PreviousPinId"}``."""
        group = group or self.group
        if not group:
            raise ValueError("unpin needs a group")
        response, _ = self.transport.call("POST", f"{self.path}/unpin", json={"group": group})
        return response.json()

    def stats(self) -> dict:
        """The consumer as the broker shows it: ``NumPending``, ``NumAckPending``, ``NumWaiting``,
        ``NumDead``, ``PriorityPolicy``, ``PriorityGroups`` ..."""
        response, _ = self.transport.call("GET", self.path)
        return response.json()

    # --- the loop --------------------------------------------------------------------------------

    def consume(self, handler, *, batch: int = 100, expires: float = 30.0, concurrency: int = 1, **options):
        """Pull and handle jobs until ``stop()`` or SIGTERM, then finish the jobs in hand and return
        the ``ConsumeStats``. ``handler(job)`` returning acks the job (DELIVERED); raising nacks it
        with backoff (``Retry(delay)`` chooses the delay, ``Reject`` makes it DEAD); a handler may
        also settle the job itself. See ``broker_client.consume.ConsumeLoop`` for ``options``."""
        return ConsumeLoop(self, handler, batch=batch, expires=expires, concurrency=concurrency, **options).run()


__all__ = ["PullConsumer", "DELIVERED", "DEAD", "QUEUED"]
