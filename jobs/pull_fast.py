"""The pull fast path: the batch pull (``PullRequest`` parsing and its priority-group checks,
atomic claims, the long-poll wait that holds no connection while it sleeps), the batch ack
(``AckItem`` parsing, ``jobs_ack``), handler-driven gate moves and progress (deadline extension).
Each request is one auth query (``jobs.pull.pull_authenticate``) plus one batched statement from
``jobs/state.py``; ``jobs.groups`` builds its grouped pulls on the waiting helpers here.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from django.db import connection

from broker.db.run import query_execute, query_fetchall, query_fetchone
from broker.errors import Conflict, InvalidInput, TooLarge
from broker.xid import job_xid
from jobs import state
from jobs.pull import STATUS_NAMES, PullContext, consumer_sweep, job_id_parse, timeout_parse
from jobs.pull_repr import rfc3339
from jobs.queries import Q
from jobs.state import DEAD, DELIVERED, QUEUED
from jobs.wakeup import wakeups

ACK_STATES = {"DELIVERED": DELIVERED, "DEAD": DEAD, "QUEUED": QUEUED}

PULL_BATCH_MAX = 1000
PULL_EXPIRES_MAX = 60.0
ACK_MAX = 1000

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


def _int_field(fields: dict, name: str, low: int, high: int, detail: str, *, default=None):
    """An integer field of a JSON body within [low, high] (``default`` when absent); else a 400
    ``invalid_<name>`` (a boolean is not an integer)."""
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"invalid_{name}", detail)
    return value


def pull_request_parse(data: dict) -> PullRequest:
    """Validate the pull body (keys case-insensitive). Every bad value is a 400."""
    if not isinstance(data, dict):
        raise InvalidInput("malformed_request", "body must be a JSON object")
    fields = {str(k).lower(): v for k, v in data.items()}
    req = PullRequest()
    req.batch = _int_field(fields, "batch", 1, PULL_BATCH_MAX, f"batch must be an integer from 1 to {PULL_BATCH_MAX}",
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
    req.max_bytes = _int_field(fields, "max_bytes", 1, 2**62, "max_bytes must be a positive integer")
    req.incremental_timeout = timeout_parse(fields.get("incrementaltimeout"))
    # priority-group fields (checked against the consumer's policy by ``pull_request_check``)
    for name in ("min_pending", "min_ack_pending"):
        setattr(req, name, _int_field(fields, name, 0, 2**62, f"{name} must be a non-negative integer", default=0))
    req.priority = _int_field(fields, "priority", 0, 9, "Bad Request - Priority must be between 0 and 9", default=0)
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


def _claim(ctx: PullContext, req: PullRequest) -> list[state.ClaimedJob]:
    if req.max_bytes is not None:
        return state.jobs_claim_within_bytes(consumer_pk=ctx.consumer_pk, limit=req.batch, max_bytes=req.max_bytes,
                                             incremental_timeout=req.incremental_timeout, reason="pull")
    return state.jobs_claim(consumer_pk=ctx.consumer_pk, limit=req.batch,
                                     incremental_timeout=req.incremental_timeout, reason="pull")


def _next_check(due_in, deadline_in, remaining: float) -> float:
    """How long to sleep: until woken, the earliest delayed job is due, the earliest in-flight
    deadline passes (then this waiter sweeps it), the safety-net interval, or the end."""
    cap = WAIT_SAFETY_NET if wakeups.connected.is_set() else WAIT_UNLISTENED
    sleep = min(remaining, cap)
    for value in (due_in, deadline_in):
        if value is not None:
            sleep = min(sleep, max(float(value), 0.0) + 0.05)
    return max(sleep, 0.01)


def pull_wait_begin(*, ctx: PullContext, req: PullRequest) -> tuple[bool, float, int]:
    """Before a pull's first claim: sweep the consumer's overdue jobs, then whether the pull may
    wait, until when (monotonic), and the wake-up mark taken now, so a publish between the first
    claim and the wait still wakes it."""
    consumer_sweep(consumer_pk=ctx.consumer_pk)
    wait = req.expires > 0 and not req.no_wait
    if wait:
        wakeups.start()
    return wait, time.monotonic() + req.expires, wakeups.mark(ctx.consumer_pk)


def jobs_pull(*, ctx: PullContext, req: PullRequest) -> list[state.ClaimedJob]:
    """Atomically claim up to ``batch`` due jobs (QUEUED -> INFLIGHT, SKIP LOCKED), so concurrent
    pullers on any number of processes never hold the same job. With ``expires`` (and not
    ``no_wait``) wait until at least one job is claimed or time runs out: the wait registers a
    waiter row (NumWaiting, priority groups), holds no database connection or transaction while
    sleeping, and is woken by the process's LISTEN thread when a publish or requeue NOTIFYs."""
    wait, end, mark = pull_wait_begin(ctx=ctx, req=req)
    jobs = _claim(ctx, req)
    if jobs or not wait:
        return jobs
    waiter_id = None
    try:
        waiter_id, due_in, deadline_in = query_fetchone(Q.pull_waiter, {
            "consumer": ctx.consumer_pk, "group": req.group, "priority": req.priority, "pin": req.pin_id,
            "batch": req.batch, "max_bytes": req.max_bytes, "expires": req.expires,
        })
        while True:
            now = time.monotonic()
            remaining = end - now
            if remaining <= 0:
                return []
            sleep = _next_check(due_in, deadline_in, remaining)
            deadline_at = now + float(deadline_in) if deadline_in is not None else None
            if not connection.in_atomic_block:  # (inside a caller's transaction there is nothing to release)
                connection.close()  # never hold a connection (or transaction) while sleeping
            wakeups.wait(ctx.consumer_pk, mark, sleep)
            mark = wakeups.mark(ctx.consumer_pk)
            consumer_sweep(consumer_pk=ctx.consumer_pk,
                           force=deadline_at is not None and time.monotonic() >= deadline_at)
            jobs = _claim(ctx, req)
            if jobs:
                return jobs
            due_in, deadline_in = query_fetchone(Q.pull_next, {"consumer": ctx.consumer_pk})
    finally:
        if waiter_id is not None:
            query_execute(Q.pull_waiter_delete, [waiter_id])


@dataclass
class AckItem:
    job_id: int | None
    raw_id: str
    target: int
    delay: float | None
    gate: int | None = None  # partitions: NextState QUEUED with a Gate moves the job to that gate
    payload: bytes | None = None  # ... with this as its new payload (None: unchanged)


def ack_request_parse(data) -> list[AckItem]:
    """``{"Jobs": [{"ID", "NextState": DELIVERED|DEAD|QUEUED, "Delay"?}]}``; structural errors are a
    400 for the whole request, an id that names no job is answered per job."""
    if not isinstance(data, dict):
        raise InvalidInput("malformed_request", "body must be a JSON object with Jobs")
    fields = {str(k).lower(): v for k, v in data.items()}
    jobs = fields.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise InvalidInput("invalid_jobs", "Jobs must be a non-empty list")
    if len(jobs) > ACK_MAX:
        raise TooLarge("batch_too_large", f"at most {ACK_MAX} jobs per ack")
    items: list[AckItem] = []
    seen: set = set()
    for i, item in enumerate(jobs):
        if not isinstance(item, dict):
            raise InvalidInput("invalid_jobs", f"Jobs[{i}] must be an object")
        if "ID" not in item or "NextState" not in item:  # Go-style case-insensitive keys (rare): normalise
            item = {str(k).lower(): v for k, v in item.items()}
            item = {"ID": item.get("id"), "NextState": item.get("nextstate"), "Delay": item.get("delay"),
                    "Gate": item.get("gate"), "Payload": item.get("payload")}
        raw = item["ID"]
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise InvalidInput("invalid_jobs", f"Jobs[{i}].ID must be a string")
        raw = str(raw)
        job_id = job_id_parse(raw)
        key = raw if job_id is None else job_id
        if key in seen:
            raise InvalidInput("duplicate_job", f"Jobs[{i}]: job {raw} appears twice")
        seen.add(key)
        target = ACK_STATES.get(item["NextState"]) if isinstance(item["NextState"], str) else None
        if target is None:
            raise InvalidInput("invalid_next_state", f"Jobs[{i}].NextState must be DELIVERED, DEAD or QUEUED")
        delay = item.get("Delay")
        if delay is not None:
            if target != QUEUED:
                raise InvalidInput("invalid_delay", f"Jobs[{i}]: Delay is only valid with NextState QUEUED")
            delay = timeout_parse(delay, "Delay") or 0.0
        gate, payload = item.get("Gate"), None
        if gate is not None:
            if target != QUEUED or delay is not None:
                raise InvalidInput("invalid_gate", f"Jobs[{i}]: Gate is only valid with NextState QUEUED (no Delay)")
            gate, payload = gate_parse(gate, item.get("Payload"), f"Jobs[{i}].")
        elif item.get("Payload") is not None:
            raise InvalidInput("invalid_payload", f"Jobs[{i}]: Payload is only valid with a Gate")
        items.append(AckItem(job_id=job_id, raw_id=raw, target=target, delay=delay, gate=gate, payload=payload))
    return items


def gate_parse(gate, raw_payload, where: str = "") -> tuple[int, bytes | None]:
    """A handler-driven gate move's ``Gate`` (integer >= 0) and ``Payload`` (a string as its UTF-8
    bytes, anything else as JSON; absent: the job keeps its payload)."""
    if isinstance(gate, bool) or not isinstance(gate, int) or not 0 <= gate < 2**31:
        raise InvalidInput("invalid_gate", f"{where}Gate must be an integer >= 0")
    if isinstance(raw_payload, str):
        return gate, raw_payload.encode("utf-8", "surrogatepass")
    if raw_payload is not None:
        return gate, json.dumps(raw_payload, separators=(",", ":")).encode()
    return gate, None


def job_gate_move(*, ctx: PullContext, gate: int, payload: bytes | None) -> None:
    """The spec path's ``NextState: QUEUED`` with a ``Gate``: the in-flight partitioned job moves
    to that (higher) gate of its partition, optionally with a new payload; anything else is a 400."""
    moved = state.jobs_move_gate(moves=[state.GateMove(job_id=ctx.job[0], gate=gate, payload=payload)],
                                 consumer_pk=ctx.consumer_pk)
    if not moved:
        raise InvalidInput("invalid_transition", "invalid transition request: QUEUED with a Gate needs an "
                                                      "INFLIGHT job in a partition and a Gate above its gate")


def jobs_ack(*, ctx: PullContext, items: list[AckItem]) -> list[dict]:
    """All outcomes in one statement (``state.jobs_ack_inflight``: UPDATE ... FROM unnest, guarded
    by INFLIGHT and the consumer), answered per job. QUEUED is a negative acknowledgement: retry
    + 1, due after ``Delay`` seconds, DEAD past the retry limit. A job that is not this consumer's
    is ``not_found``; one that is not INFLIGHT is a ``conflict`` (with its current Status)."""
    moves = [it for it in items if it.job_id is not None and it.gate is not None]
    moved_gate = state.jobs_move_gate(
        moves=[state.GateMove(job_id=it.job_id, gate=it.gate, payload=it.payload) for it in moves],
        consumer_pk=ctx.consumer_pk) if moves else {}
    known = [it for it in items if it.job_id is not None and it.gate is None]
    outcome = state.jobs_ack_inflight(
        consumer_pk=ctx.consumer_pk, job_ids=[it.job_id for it in known],
        to_statuses=[it.target for it in known], delays=[it.delay for it in known],
        max_retry=ctx.max_retry, reason="pull-ack",
    ) if known else {}
    current = {}
    missed = [it.job_id for it in moves if it.job_id not in moved_gate]
    if missed:
        current = dict(query_fetchall(Q.ack_current, [missed, ctx.consumer_pk]))
    result = []
    for it in items:
        if it.gate is not None and it.job_id is not None:
            if it.job_id in moved_gate:
                result.append({"ID": it.raw_id, "Status": "QUEUED", "Gate": it.gate})
            elif it.job_id in current:
                result.append({"ID": it.raw_id, "Status": STATUS_NAMES.get(current[it.job_id]), "Error": "conflict",
                               "Detail": "job is not INFLIGHT in a partition below that Gate"})
            else:
                result.append({"ID": it.raw_id, "Status": None, "Error": "not_found", "Detail": "job not found"})
            continue
        moved, status, retry = outcome.get(it.job_id, (False, None, None))
        if moved:
            result.append({"ID": it.raw_id, "Status": STATUS_NAMES[status], "RetryCount": retry})
        elif status is not None:
            result.append({"ID": it.raw_id, "Status": STATUS_NAMES.get(status), "Error": "conflict",
                           "Detail": "job is not INFLIGHT"})
        else:
            result.append({"ID": it.raw_id, "Status": None, "Error": "not_found", "Detail": "job not found"})
    return result


def job_progress(*, ctx: PullContext, incremental_timeout: float | None) -> dict:
    """Work in progress: extend an in-flight job's deadline; 409 when it is not INFLIGHT."""
    extended = state.jobs_extend(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]],
                                 incremental_timeout=incremental_timeout)
    if ctx.job[0] not in extended:
        raise Conflict("job_not_inflight", "job is not INFLIGHT")
    deadline, retry = extended[ctx.job[0]]
    return {"ID": job_xid(ctx.job[0]), "Status": "INFLIGHT", "Deadline": rfc3339(deadline), "RetryCount": retry}
