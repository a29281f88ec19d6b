"""The batch pull: the request (``PullRequest``: parsing and its priority-group checks), the claim
(QUEUED -> INFLIGHT, SKIP LOCKED, within the consumer's room and an optional byte budget:
``jobs_claim``) and the long-poll wait that holds no transaction, and at most a few idle
connections per process, while it sleeps (``jobs_pull``). Concurrent pullers on any number of processes never hold the same job."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from broker.db.run import query_execute, query_fetchall, query_fetchone
from broker.errors import InvalidInput
from broker.tracing import TraceContext
from jobs.publish.messages import headers_decode
from jobs.pull.auth import PullContext
from jobs.pull.fields import int_field, timeout_parse
from jobs.pull.next import pull_next_in
from jobs.pull.queries import Q
from jobs.pull.wakeups import connection_parked, wakeups
from jobs.state import floors
from jobs.state.retries import inflight_timeout
from jobs.state.transitions import INFLIGHT, QUEUED, transition_check
from jobs.sweeps.inflight_timeout import consumer_sweep


@dataclass
class ClaimedJob:
    id: int
    priority: int
    retry_count: int
    incremental_timeout: float
    deadline: object
    message_id: str
    payload: bytes
    content_type: str
    headers: dict
    partition_key: str | None = None
    gate: int = 0
    message_type: str | None = None  # filters: the message's X-Broker-Message-Type
    receipt: int | None = None  # this claim's receipt (jobs.pull.ack)
    trace: TraceContext | None = None  # the message's traceparent / tracestate (broker.tracing)


def claimed_jobs(rows) -> list[ClaimedJob]:
    """Rows shaped like ``claim_pull``'s result (id, priority, retry_count, incremental_timeout,
    deadline, message_id, payload, content_type, headers[, partition key, gate[, type[, receipt,
    traceparent, tracestate]]]) as ClaimedJob objects."""
    return [
        ClaimedJob(id=r[0], priority=r[1], retry_count=r[2], incremental_timeout=r[3], deadline=r[4],
                   message_id=r[5], payload=bytes(r[6]), content_type=r[7], headers=headers_decode(r[8]),
                   partition_key=r[9] if len(r) > 9 else None, gate=r[10] if len(r) > 10 and r[10] else 0,
                   message_type=r[11] if len(r) > 11 else None, receipt=r[12] if len(r) > 12 else None,
                   trace=TraceContext(r[13] or "", r[14] or "") if len(r) > 14 else None)
        for r in rows
    ]


def jobs_claim(*, consumer_pk: int, limit: int, max_bytes: int | None = None,
               incremental_timeout: float | None = None, connection_timeout: float | None = None,
               reason: str = "claim") -> list[ClaimedJob]:
    """Claim up to ``limit`` due QUEUED jobs of one consumer (priority, then oldest first), within
    the consumer's room (not paused, ``maxAckPending``); with ``max_bytes``, stop before the
    payloads add up to more than that (always at least one job, so one large payload cannot block
    the consumer).

    One prepared statement (pulls claim in many small statements, where planning would cost more
    than the claim): ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the rows, the running payload sum
    (from the stored sizes, no detoasting) cuts the prefix that fits, the UPDATE moves them to
    INFLIGHT with a deadline of stopTimeout + rationalDelay + IncrementalTimeout (an omitted
    IncrementalTimeout keeps the job's stored one), and the trigger writes the history rows.
    """
    transition_check(QUEUED, INFLIGHT, "claim")
    if limit <= 0:
        return []
    began = time.monotonic()
    (fp, fi), full = floors.CLAIM_PULL.position(consumer_pk, began)
    rsince, rfull = floors.RETRIES_PULL.time(consumer_pk, began)
    rows = query_fetchall(Q.claim_pull, {
        "consumer": consumer_pk, "limit": int(limit), "max_bytes": None if max_bytes is None else int(max_bytes),
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
        "fp": fp, "fi": fi, "rsince": rsince, "lag": floors.LAG,
    }, prepare=True)
    jobs = [row for row in rows if row[0] is not None]
    for row in rows:
        if row[0] is None:  # the last row: where the walks found live jobs, the id sequence (jobs.state.floors)
            floors.CLAIM_PULL.walked(consumer_pk, began=began, full=full, level=fp,
                                     first=(row[15], row[16]) if row[16] is not None else None, sequence=row[17])
            floors.RETRIES_PULL.walked(consumer_pk, began=began, full=rfull, value=row[18])
    return claimed_jobs(jobs)


PULL_BATCH_MAX = 1000
PULL_EXPIRES_MAX = 60.0
WAIT_SAFETY_NET = 5.0  # a waiting pull re-checks at least this often while the listener is up
WAIT_UNLISTENED = 1.0  # ... and this often while it is (re)connecting


@dataclass
class PullRequest:
    batch: int = 1
    expires: float = 0.0
    no_wait: bool = False
    max_bytes: int | None = None
    incremental_timeout: float | None = None
    group: str = ""
    priority: int = 0
    pin_id: str = ""
    min_pending: int = 0
    min_ack_pending: int = 0
    # Whether the client that sent the pull has hung up (the web layer's check of its socket; None:
    # not known, taken as connected). A woken long-poll asks before it claims: jobs claimed for a
    # client that is gone would sit in flight until their lease ran out (issue 23).
    client_gone: Callable[[], bool] | None = None


def pull_request_parse(data: dict) -> PullRequest:
    """Validate the pull body (keys case-insensitive). Every bad value is a 400."""
    if not isinstance(data, dict):
        raise InvalidInput("malformed_request", "body must be a JSON object")
    fields = {str(k).lower(): v for k, v in data.items()}
    req = PullRequest()
    req.batch = int_field(fields, "batch", 1, PULL_BATCH_MAX, f"batch must be an integer from 1 to {PULL_BATCH_MAX}",
                           default=req.batch)
    expires = fields.get("expires")
    if expires is not None:
        if (isinstance(expires, bool) or not isinstance(expires, (int, float)) or not math.isfinite(expires)
                or not 0 <= expires <= PULL_EXPIRES_MAX):
            raise InvalidInput("invalid_expires", f"expires must be seconds from 0 to {PULL_EXPIRES_MAX:.0f}")
        req.expires = float(expires)
    no_wait = fields.get("no_wait")
    if no_wait is not None:
        if not isinstance(no_wait, bool):
            raise InvalidInput("invalid_no_wait", "no_wait must be true or false")
        req.no_wait = no_wait
    req.max_bytes = int_field(fields, "max_bytes", 1, 2**62, "max_bytes must be a positive integer")
    req.incremental_timeout = timeout_parse(fields.get("incrementaltimeout"))
    # priority-group fields (checked against the consumer's policy by ``pull_request_check``)
    for name in ("min_pending", "min_ack_pending"):
        setattr(req, name, int_field(fields, name, 0, 2**62, f"{name} must be a non-negative integer", default=0))
    req.priority = int_field(fields, "priority", 0, 9, "Bad Request - Priority must be between 0 and 9", default=0)
    group = fields.get("group")
    if group is not None:
        if not isinstance(group, str):
            raise InvalidInput("invalid_group", "Bad Request - Invalid Priority Group")
        req.group = group
    pin = fields.get("id")
    if pin is not None:
        if not isinstance(pin, str) or len(pin) > 64:
            raise InvalidInput("invalid_id", "id must be the pin id string the broker sent")
        req.pin_id = pin
    return req


def pull_request_check(*, ctx: PullContext, req: PullRequest) -> None:
    """The priority-group checks of a pull, in ADR-42's order; a rejected pull is never queued."""
    if (req.min_pending or req.min_ack_pending) and ctx.policy != "overflow":
        raise InvalidInput("not_overflow_consumer", "Bad Request - Not a Overflow Priority consumer")
    if req.pin_id and ctx.policy != "pinned_client":
        raise InvalidInput("not_pinned_consumer", "Bad Request - Not a Pinned Client Priority consumer")
    if ctx.policy != "none" and not req.group:
        raise InvalidInput("group_missing", "Bad Request - Priority Group missing")
    if req.group and req.group not in (ctx.groups or []):
        raise InvalidInput("invalid_group", "Bad Request - Invalid Priority Group")


_claimed: dict[int, tuple[float, bool]] = {}  # consumer pk -> (monotonic time, full) of this process's last claim
_claimed_lock = threading.Lock()


def _claim(ctx: PullContext, req: PullRequest, *, window: bool = False) -> list[ClaimedJob]:
    """One claim; with ``window`` (a waiting pull) not before ``BROKER_PULL_WINDOW`` has passed since
    this process's last claim for the consumer, when that one did not fill its batch (the consumer had
    caught up): under load a waiting pull then takes the batch that gathered meanwhile in one
    statement (whose triggers' history and counter rows cost the same for one job or hundreds)
    instead of one or two jobs per claim. After a quiet spell, or behind a backlog (the last claim
    was full), it claims at once."""
    if window:
        with _claimed_lock:
            last, full = _claimed.get(ctx.consumer_pk, (float("-inf"), True))
        hold = last + float(settings.BROKER_PULL_WINDOW) - time.monotonic()
        if hold > 0 and not full:
            time.sleep(hold)
    jobs: list[ClaimedJob] = []
    try:
        jobs = jobs_claim(consumer_pk=ctx.consumer_pk, limit=req.batch, max_bytes=req.max_bytes,
                          incremental_timeout=req.incremental_timeout, reason="pull")
        return jobs
    finally:
        with _claimed_lock:
            _claimed[ctx.consumer_pk] = (time.monotonic(), len(jobs) >= req.batch)


def _next_check(due_in, deadline_in, remaining: float) -> float:
    """How long to sleep: until woken, the earliest delayed job is due, the earliest in-flight
    deadline passes (then this waiter sweeps it), the safety-net interval, or the end."""
    cap = WAIT_SAFETY_NET if wakeups.connected.is_set() else WAIT_UNLISTENED
    sleep = min(remaining, cap)
    for value in (due_in, deadline_in):
        if value is not None:
            sleep = min(sleep, max(float(value), 0.0) + 0.05)
    return max(sleep, 0.01)


def _waited_out(*, woken: bool, listening: bool, sleep: float, remaining: float, due_in, deadline_in) -> bool:
    """A wait that slept out the pull's whole time, unwoken, with the listener up throughout and no
    delayed job or deadline falling due before the end, has nothing new to claim: every way a job
    becomes claimable either NOTIFYs (a publish, a requeue, a nack, a gate) or was foreseen by
    ``pull_next``. So the pull ends without another claim: an idle long poll costs half the
    statements (no second sweep, claim and ``pull_next`` per cycle)."""
    if woken or not listening or sleep < remaining:
        return False
    return all(value is None or float(value) >= remaining for value in (due_in, deadline_in))


def pull_wait_begin(*, ctx: PullContext, req: PullRequest) -> tuple[bool, float, int]:
    """Before a pull's first claim: sweep the consumer's overdue jobs, then whether the pull may
    wait, until when (monotonic), and the wake-up mark taken now, so a publish between the first
    claim and the wait still wakes it."""
    consumer_sweep(consumer_pk=ctx.consumer_pk)
    wait = req.expires > 0 and not req.no_wait
    if wait:
        wakeups.start()
    return wait, time.monotonic() + req.expires, wakeups.mark(ctx.consumer_pk)


def jobs_pull(*, ctx: PullContext, req: PullRequest) -> list[ClaimedJob]:
    """Atomically claim up to ``batch`` due jobs (QUEUED -> INFLIGHT, SKIP LOCKED), so concurrent
    pullers on any number of processes never hold the same job. With ``expires`` (and not
    ``no_wait``) wait until at least one job is claimed or time runs out: the wait registers a
    waiter row (NumWaiting, priority groups), holds no transaction (and, beyond a few waiters per
    process, no connection: ``connection_parked``) while
    sleeping, and is woken by the process's LISTEN thread when a publish or requeue NOTIFYs. A woken
    pull whose client has hung up (``req.client_gone``) claims nothing and leaves the waiting list."""
    wait, end, mark = pull_wait_begin(ctx=ctx, req=req)
    jobs = _claim(ctx, req, window=wait)
    if jobs or not wait:
        return jobs
    waiter_id = None
    try:
        waiter_id = query_fetchone(Q.pull_waiter, {
            "consumer": ctx.consumer_pk, "group": req.group, "priority": req.priority, "pin": req.pin_id,
            "batch": req.batch, "max_bytes": req.max_bytes, "expires": req.expires,
        })[0]
        due_in, deadline_in = pull_next_in(consumer_pk=ctx.consumer_pk)
        while True:
            now = time.monotonic()
            remaining = end - now
            if remaining <= 0:
                return []
            sleep = _next_check(due_in, deadline_in, remaining)
            deadline_at = now + float(deadline_in) if deadline_in is not None else None
            listening = wakeups.connected.is_set()
            with connection_parked():  # never a transaction, and few connections, while sleeping
                woken = wakeups.wait(ctx.consumer_pk, mark, sleep)
            if req.client_gone is not None and req.client_gone():
                return []  # abandoned: claims nothing and leaves the waiting list (finally)
            if _waited_out(woken=woken, listening=listening and wakeups.connected.is_set(),
                           sleep=sleep, remaining=remaining, due_in=due_in, deadline_in=deadline_in):
                return []
            mark = wakeups.mark(ctx.consumer_pk)
            consumer_sweep(consumer_pk=ctx.consumer_pk,
                           force=deadline_at is not None and time.monotonic() >= deadline_at)
            jobs = _claim(ctx, req, window=True)
            if jobs:
                return jobs
            due_in, deadline_in = pull_next_in(consumer_pk=ctx.consumer_pk)
    finally:
        if waiter_id is not None:
            query_execute(Q.pull_waiter_delete, [waiter_id])
