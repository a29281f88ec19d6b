"""Pull consumers: the pull-consumer spec (queued-jobs listing, the job state endpoint) and the
fast path (atomic batch pull with long-polling, batch ack, progress), plus consumer statistics.

Hot paths are one auth query plus one batched statement from ``jobs/state.py`` (claim / move via
unnest), no ORM instantiation: measured on this machine, batched raw claims and acks run ~40k
jobs/s against ~0.4k/s for a per-job ORM loop. Every state change goes through ``jobs.state``.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from broker import xid
from broker.counters import JOB, REDELIVERED, counts_for
from broker.db.run import query_execute, query_fetchall, query_fetchone
from broker.errors import Conflict, InvalidInput, NotFound, PreconditionFailed, TooLarge
from broker.tokens import token_require
from broker.xid import job_xid
from jobs import pull_moves, state
from jobs.expiry import job_expired_status
from jobs.queries import Q
from jobs.state import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.wakeup import wakeups

STATUS_NAMES = {QUEUED: "QUEUED", INFLIGHT: "INFLIGHT", DELIVERED: "DELIVERED", DEAD: "DEAD"}
SPEC_STATES = {"INFLIGHT": INFLIGHT, "DELIVERED": DELIVERED, "DEAD": DEAD}
ACK_STATES = {"DELIVERED": DELIVERED, "DEAD": DEAD, "QUEUED": QUEUED}

QUEUED_JOBS_DEFAULT = 25
QUEUED_JOBS_MAX = 100
PULL_BATCH_MAX = 1000
PULL_EXPIRES_MAX = 60.0
ACK_MAX = 1000
TIMEOUT_MAX = 10 * 365 * 24 * 3600.0  # an IncrementalTimeout / Delay beyond ten years is a typo

SWEEP_INTERVAL = 1.0  # seconds between lazy per-consumer timeout sweeps in one process
WAIT_SAFETY_NET = 5.0  # a waiting pull re-checks at least this often while the listener is up
WAIT_UNLISTENED = 1.0  # ... and this often while it is (re)connecting


@dataclass
class PullContext:
    """The authenticated channel and consumer of a pull request (and the job, for job URLs)."""

    channel_pk: int
    channel_id: str
    consumer_pk: int
    consumer_id: str
    consumer_type: str
    max_retry: int
    job: tuple | None = None  # (id, status, retry_count, incremental_timeout, expired)
    policy: str = "none"  # priority groups (jobs.groups)
    groups: list | None = None
    priority_timeout: float | None = None


def job_id_parse(raw: str) -> int | None:
    """Job IDs are xid strings (``broker.xid``, decoded without the database); anything else,
    an integer string too, names no job (404, or a per-job not_found in an ack)."""
    return xid.job_pk(raw)


def pull_authenticate(*, channel_id: str, consumer_id: str, channel_token: str | None,
                      consumer_token: str | None, admin: bool = False, require_pull: bool = True,
                      job_id: str | None = None) -> PullContext:
    """One query for channel, consumer (and job), then ``auth_check``."""
    job_pk = job_id_parse(job_id) if job_id is not None else None
    rows = query_fetchall(Q.pull_auth, {"channel": channel_id, "consumer": consumer_id, "job": job_pk}, prepare=True)
    return auth_check(rows[0] if rows else None, channel_id=channel_id, consumer_id=consumer_id,
                      channel_token=channel_token, consumer_token=consumer_token, admin=admin,
                      require_pull=require_pull, with_job=job_id is not None)


def auth_check(row, *, channel_id: str, consumer_id: str, channel_token: str | None, consumer_token: str | None,
               admin: bool = False, require_pull: bool = True, with_job: bool = False) -> PullContext:
    """Checks in the spec's order on an auth row (``pull_auth``'s columns): channel 404, channel
    token 401/403, consumer 404, consumer token 401/403, push consumer 412, job 404 (unknown, not
    an integer, or another consumer's). ``admin`` (already verified) skips the token checks."""
    if row is None:
        raise NotFound("channel_not_found", "channel not found")
    if not admin:
        token_require(channel_token, row[1], header="X-Broker-Channel-Token", code="channel_token_mismatch",
                      detail="channel token does not match")
    if row[2] is None:
        raise NotFound("consumer_not_found", "consumer not found")
    if not admin:
        token_require(consumer_token, row[3], header="X-Broker-Consumer-Token", code="consumer_token_mismatch",
                      detail="consumer token does not match")
    if require_pull and row[4] != "pull":
        raise PreconditionFailed("consumer_not_pull", "consumer not pull based")
    ctx = PullContext(channel_pk=row[0], channel_id=channel_id, consumer_pk=row[2], consumer_id=consumer_id,
                      consumer_type=row[4], max_retry=state.max_retry_for(row[5]))
    if len(row) > 11 and row[11] is not None and row[11] != "none":
        groups = row[12]
        ctx.policy = row[11]
        ctx.groups = json.loads(groups) if isinstance(groups, (str, bytes)) else list(groups or [])
        ctx.priority_timeout = row[13]
    if with_job:
        if row[6] is None:
            raise NotFound("job_not_found", "job not found")
        ctx.job = (row[6], row[7], row[8], row[9], bool(row[10]))
    return ctx


# --- representation ---------------------------------------------------------------------------------

def seconds_repr(value: float) -> float | int:
    """Whole seconds as integers (webhook-broker's uint), fractions kept."""
    return int(value) if float(value).is_integer() else value


def message_repr(message_id: str, payload: bytes, content_type: str, headers) -> dict:
    """The spec's Message; a payload that is not UTF-8 goes out as base64 with ``PayloadEncoding``."""
    message = {"MessageID": message_id, "Payload": None, "ContentType": content_type,
               "Headers": state._headers(headers)}
    try:
        message["Payload"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        message["Payload"] = base64.b64encode(payload).decode()
        message["PayloadEncoding"] = "base64"
    return message


def rfc3339(value) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def claimed_repr(job: state.ClaimedJob) -> dict:
    body = {
        "ID": job_xid(job.id),
        "Priority": job.priority,
        "IncrementalTimeout": seconds_repr(job.incremental_timeout),
        "Attempt": job.retry_count + 1,
        "Deadline": rfc3339(job.deadline),
        "Message": message_repr(job.message_id, job.payload, job.content_type, job.headers),
    }
    if job.message_type is not None:  # filters: the message's X-Broker-Message-Type
        body["Type"] = job.message_type
    if job.partition_key is not None:  # jobs.partitions: ack with NextState QUEUED + a higher Gate to move on
        body["PartitionKey"] = job.partition_key
        body["Gate"] = job.gate
    return body


# --- timeouts ----------------------------------------------------------------------------------------

_last_sweep: dict[int, float] = {}
_sweep_lock = threading.Lock()


def consumer_sweep(*, consumer_pk: int, force: bool = False) -> int:
    """Requeue (or kill) this consumer's in-flight jobs whose deadline passed. The workers sweep
    every consumer periodically; the pull endpoints also sweep their own consumer at most once a
    second per process, so a pull consumer's timeouts hold within about a second even when no
    worker runs. Cheap when nothing expired (partial index on in-flight deadlines)."""
    now = time.monotonic()
    with _sweep_lock:
        if not force and now - _last_sweep.get(consumer_pk, -1e9) < SWEEP_INTERVAL:
            return 0
        _last_sweep[consumer_pk] = now
    return state.jobs_expire_inflight(consumer_pk=consumer_pk, budget=0)  # one batch: a request waits on it


# --- the spec: queued-jobs and the job state endpoint ----------------------------------------------

def limit_parse(raw: str | None, *, default: int = QUEUED_JOBS_DEFAULT, maximum: int = QUEUED_JOBS_MAX) -> int:
    """``limit``: default 25, clipped to 100, 0 allowed; non-integer or negative is a 400."""
    if raw is None or raw == "":
        return default
    text = raw[1:] if raw.startswith("+") else raw
    if not text.isascii() or not text.isdigit():
        raise InvalidInput("invalid_limit", "limit must be a non-negative integer")
    return min(int(text), maximum)




def queued_jobs_list(*, ctx: PullContext, limit: int) -> list[dict]:
    """QUEUED jobs whose next attempt is due, priority descending then oldest first. Not a lease:
    every poller sees the same jobs until one claims them (INFLIGHT)."""
    if limit <= 0:
        return []
    consumer_sweep(consumer_pk=ctx.consumer_pk)
    rows = query_fetchall(Q.queued_jobs, {"consumer": ctx.consumer_pk, "limit": limit}, prepare=True)
    result = []
    for r in rows:
        item = {"ID": job_xid(r[0]), "Priority": r[1], "IncrementalTimeout": seconds_repr(r[2]),
                "Message": message_repr(r[3], bytes(r[4]), r[5], r[6])}
        if r[7] is not None:  # filters: the message's type
            item["Type"] = r[7]
        result.append(item)
    return result


def timeout_parse(value, name: str = "IncrementalTimeout") -> float | None:
    """Seconds: a non-negative number (None when absent). 0 counts as absent, as in webhook-broker
    where the field is an unsigned integer whose zero value means 'not given'."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"invalid_{name}", f"{name} must be a number of seconds")
    if value < 0 or value > TIMEOUT_MAX:
        raise InvalidInput(f"invalid_{name}", f"{name} must be between 0 and {TIMEOUT_MAX:.0f} seconds")
    return float(value) if value else None


def job_transition(*, channel_id: str, consumer_id: str, job_id: str, channel_token: str | None,
                   consumer_token: str | None, next_state: str, incremental_timeout: float | None) -> None:
    """The spec's state endpoint. Allowed: QUEUED->INFLIGHT, INFLIGHT->DELIVERED, INFLIGHT->DEAD,
    DEAD->INFLIGHT (retry + 1, no cap). The same state is a no-op (the caller answers 202; so a
    second claimer of an INFLIGHT job cannot tell it lost unless it sends an IncrementalTimeout,
    which is then a 400 - the ``pull`` endpoint is the safe way to claim). IncrementalTimeout only
    with INFLIGHT from QUEUED or DEAD. Everything else, and a lost race, is a 400.

    One round trip: ``state.job_move_pull_authenticated_grouped`` reads the auth row and attempts the
    move (guarded by the tokens and the job's status) in one statement; the checks below then
    decide the answer from the row as it was before the move. Committed asynchronously unless
    ``BROKER_PULL_ASYNC_COMMIT`` is off (``jobs.pull_moves`` says why that is safe)."""
    target = SPEC_STATES[next_state]
    if incremental_timeout is not None and target != INFLIGHT:
        from_states: list[int] = []  # never moves; the 400 comes after the auth checks
    else:
        from_states = [QUEUED, DEAD] if target == INFLIGHT else [INFLIGHT]
    move = (pull_moves.job_move_pull_authenticated_async if settings.BROKER_PULL_ASYNC_COMMIT
            else state.job_move_pull_authenticated_grouped)
    row, moved, policy = move(
        channel_id=channel_id, consumer_id=consumer_id, job_id=job_id_parse(job_id),
        channel_token=channel_token, consumer_token=consumer_token, from_statuses=from_states,
        to_status=target, incremental_timeout=incremental_timeout, reason="pull")
    ctx = auth_check(row, channel_id=channel_id, consumer_id=consumer_id, channel_token=channel_token,
                     consumer_token=consumer_token, with_job=True)
    if moved:
        return
    if target == INFLIGHT and policy not in ("", "none"):  # claims go through the group dispatcher
        raise InvalidInput("group_missing", "Bad Request - Priority Group missing: claim jobs of a consumer "
                                                 "with a priority policy through .../pull with a group")
    current = ctx.job[1]
    if target == INFLIGHT and current in from_states and job_expired_status(job_pk=ctx.job[0]) is not None:
        raise Conflict("message_expired", "the job's message has expired: it is never handed out")
    if incremental_timeout is not None and (target != INFLIGHT or current == INFLIGHT):
        raise InvalidInput("timeout_invalid_state", "timeout provided with invalid state")
    if current == target:
        return
    if current in from_states:  # it was in a state we could move from, and someone else moved it first
        raise InvalidInput("invalid_transition", "invalid transition request: the job changed state concurrently")
    raise InvalidInput("invalid_transition", "invalid transition request")




def job_detail(*, ctx: PullContext) -> dict:
    """webhook-broker's job shape (status and links) plus retry count, deadline and priority. An
    in-flight job past its deadline is swept first, so the answer never shows a stale lease."""
    if ctx.job[1] == INFLIGHT and ctx.job[4]:
        consumer_sweep(consumer_pk=ctx.consumer_pk, force=True)
    row = query_fetchone(Q.pull_job, [ctx.job[0], ctx.consumer_pk])
    if row is None:
        raise NotFound("job_not_found", "job not found")

    base = f"/channel/{ctx.channel_id}/consumer/{ctx.consumer_id}"
    status = row[1]
    return {
        "ID": job_xid(row[0]),
        "Status": STATUS_NAMES.get(status, str(status)),
        "ListenerEndpoint": row[10],
        "ListenerName": row[11],
        "StatusChangedAt": rfc3339(row[6]),
        "MessageURL": f"/channel/{ctx.channel_id}/message/{quote(row[8], safe='-_.~')}",
        "ChannelURL": f"/channel/{ctx.channel_id}",
        "ConsumerURL": base,
        "ProducerURL": f"/producer/{row[9]}",
        "JobRequeueURL": f"{base}/job/{job_xid(row[0])}/requeue-dead-job" if status == DEAD else "",
        "RetryCount": row[2],
        "Priority": row[3],
        "IncrementalTimeout": seconds_repr(row[4]),
        "Deadline": rfc3339(row[5]) if status == INFLIGHT else None,
        "NextAttemptAt": rfc3339(row[7]) if status == QUEUED else None,
    }


def job_requeue_dead(*, ctx: PullContext) -> None:
    """DEAD -> QUEUED with the retry count reset; a job that is not DEAD is a 400, one whose
    message expired a 409 ``message_expired``."""
    if state.jobs_requeue_dead(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]], reason="requeue-dead-job") != 1:
        if job_expired_status(job_pk=ctx.job[0]) == DEAD:
            raise Conflict("message_expired", "the job's message has expired: it cannot be delivered any more")
        raise InvalidInput("job_not_dead", "job could not be found in DEAD state")


def job_delete_dead(*, ctx: PullContext) -> None:
    """Delete one dead job; 404 when it is not DEAD (as if there were no such dead job)."""
    if state.jobs_delete_dead(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]]) != 1:
        raise NotFound("dead_job_not_found", "no such dead job")


# --- the fast path: pull, ack, progress ---------------------------------------------------------

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


# --- statistics --------------------------------------------------------------------------------------

def consumer_stats(*, consumer_pk: int, sweep: bool = False) -> dict:
    """Maintained counters (never COUNT(*) over jobs) plus the live waiter rows. ``sweep`` (pull
    consumers) first requeues expired leases, at most once a second per process, so the numbers
    do not show a lease that has run out."""
    if sweep:
        consumer_sweep(consumer_pk=consumer_pk)
    counts = counts_for(scope=JOB, owner_ids=[consumer_pk]).get(consumer_pk, {})
    waiting = int(query_fetchone(Q.pull_waiting, [consumer_pk])[0])
    return {
        "NumPending": counts.get(QUEUED, 0),
        "NumAckPending": counts.get(INFLIGHT, 0),
        "NumRedelivered": counts.get(REDELIVERED, 0),
        "NumWaiting": waiting,
        "NumDead": counts.get(DEAD, 0),
        "NumDelivered": counts.get(DELIVERED, 0),
    }



# --- flow control: purge ------------------------------------------------------------------------------

def older_than_parse(raw: str | None) -> dict:
    """``olderThan``: an RFC 3339 time, or an age in seconds. Returns the keyword arguments of
    ``state.jobs_purge_queued`` (empty: no filter); anything else is a 400."""
    if raw is None or raw.strip() == "":
        return {}
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not 0 <= seconds < 1e10 or seconds != seconds:
            raise InvalidInput("invalid_olderThan", "olderThan must be RFC 3339 or non-negative seconds")
        return {"older_than_seconds": seconds}

    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput("invalid_olderThan", "olderThan must be RFC 3339 or non-negative seconds") from None
    if value.tzinfo is None:
        raise InvalidInput("invalid_olderThan", "olderThan needs a time zone offset (RFC 3339)")
    return {"older_than": value}


def queued_jobs_purge(*, ctx: PullContext, older_than: str | None = None) -> int:
    """Drop the consumer's QUEUED jobs in batches (``state.jobs_purge_queued``); returns the count."""
    return state.jobs_purge_queued(consumer_pk=ctx.consumer_pk, **older_than_parse(older_than))
