"""A pull consumer's outcomes: the batch ack (``AckItem`` parsing, ``jobs_ack`` over the status
writer ``jobs_ack_inflight``: INFLIGHT -> DELIVERED / DEAD / QUEUED in one statement), handler-driven
gate moves of partitioned jobs, and progress (``job_progress``: a deadline extension, no move).

Receipts: every claim gives the job a new receipt (``jobs_job.receipt``, from a sequence: it never
repeats for the job, a replay included), sent with the job as ``"Receipt"``. An ack item or a
progress request that carries one changes the job only while that claim is the current one, checked
in the same statement; a late one from a holder whose lease ran out (the job was claimed again by
someone else) changes nothing and is answered ``stale_receipt``, as SQS receipt handles and Pub/Sub
ack ids are refused. Without a receipt everything is as before (webhook-broker's spec has none)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from broker.db.run import query_fetchall, query_fetchone
from broker.errors import Conflict, InvalidInput, TooLarge
from broker.numbers import whole
from broker.times import rfc3339
from broker.xid import job_xid
from jobs.partitions.gates import GateMove, jobs_move_gate
from jobs.partitions.settle import settle_on_commit
from jobs.pull.auth import PullContext
from jobs.pull.fields import job_id_parse, receipt_parse, timeout_parse
from jobs.pull.queries import Q
from jobs.pull.traces import ack_spans, now_ns
from jobs.state.retries import inflight_timeout
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED, STATUS_NAMES, transitions_check

ACK_STATES = {"DELIVERED": DELIVERED, "DEAD": DEAD, "QUEUED": QUEUED}
STALE_DETAIL = "Receipt is not the job's current claim: it was claimed again since (your lease ran out)"
ACK_MAX = 1000


@dataclass
class AckItem:
    job_id: int | None
    raw_id: str
    target: int
    delay: float | None
    gate: int | None = None  # partitions: NextState QUEUED with a Gate moves the job to that gate
    payload: bytes | None = None  # ... with this as its new payload (None: unchanged)
    receipt: int | None = None  # the claim this outcome is for (None: whichever is current)


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
                    "Gate": item.get("gate"), "Payload": item.get("payload"), "Receipt": item.get("receipt")}
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
        receipt = receipt_parse(item.get("Receipt"), f"Jobs[{i}].")
        items.append(AckItem(job_id=job_id, raw_id=raw, target=target, delay=delay, gate=gate, payload=payload,
                             receipt=receipt))
    return items


def gate_parse(gate, raw_payload, where: str = "") -> tuple[int, bytes | None]:
    """A handler-driven gate move's ``Gate`` (integer >= 0) and ``Payload`` (a string as its UTF-8
    bytes, anything else as JSON; absent: the job keeps its payload)."""
    gate = whole(gate)  # 2.0 is an integer (JSON Schema 2020-12)
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
    moved = jobs_move_gate(moves=[GateMove(job_id=ctx.job[0], gate=gate, payload=payload)],
                                 consumer_pk=ctx.consumer_pk)
    if not moved:
        raise InvalidInput("invalid_transition", "invalid transition request: QUEUED with a Gate needs an "
                                                      "INFLIGHT job in a partition and a Gate above its gate")


def jobs_ack(*, ctx: PullContext, items: list[AckItem]) -> list[dict]:
    """All outcomes in one statement (``jobs_ack_inflight``: UPDATE ... FROM unnest, guarded
    by INFLIGHT and the consumer), answered per job. QUEUED is a negative acknowledgement: retry
    + 1, due after ``Delay`` seconds, DEAD past the retry limit. A job that is not this consumer's
    is ``not_found``; one that is not INFLIGHT is a ``conflict`` (with its current Status); one whose
    ``Receipt`` is not its current claim's is ``stale_receipt`` (with its current Status), unchanged.
    An ack sent again after its answer was lost (its ``Receipt`` still the current claim's, the job
    already in the state it asks for) is answered as done, as SQS and Pub/Sub acks are idempotent."""
    moves = [it for it in items if it.job_id is not None and it.gate is not None]
    moved_gate = jobs_move_gate(
        moves=[GateMove(job_id=it.job_id, gate=it.gate, payload=it.payload) for it in moves],
        consumer_pk=ctx.consumer_pk) if moves else {}
    known = [it for it in items if it.job_id is not None and it.gate is None]
    started = now_ns()
    outcome = jobs_ack_inflight(
        consumer_pk=ctx.consumer_pk, job_ids=[it.job_id for it in known],
        to_statuses=[it.target for it in known], delays=[it.delay for it in known],
        max_retry=ctx.max_retry, reason="pull-ack", receipts=[it.receipt for it in known],
    ) if known else {}
    ack_spans(ctx=ctx, outcomes={k: v[1] if v[0] else None for k, v in outcome.items()}, start_ns=started)
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
        moved, status, retry, receipt = outcome.get(it.job_id, (False, None, None, None))
        if moved or (status == it.target and it.receipt is not None and it.receipt == receipt):
            result.append({"ID": it.raw_id, "Status": STATUS_NAMES[status], "RetryCount": retry})
        elif status is not None and it.receipt is not None and it.receipt != receipt:
            result.append({"ID": it.raw_id, "Status": STATUS_NAMES.get(status), "Error": "stale_receipt",
                           "Detail": STALE_DETAIL})
        elif status is not None:
            result.append({"ID": it.raw_id, "Status": STATUS_NAMES.get(status), "Error": "conflict",
                           "Detail": "job is not INFLIGHT"})
        else:
            result.append({"ID": it.raw_id, "Status": None, "Error": "not_found", "Detail": "job not found"})
    return result


def job_progress(*, ctx: PullContext, incremental_timeout: float | None, receipt: int | None = None) -> dict:
    """Work in progress: extend an in-flight job's deadline (only the claim ``receipt`` names, when
    given); 409 ``job_not_inflight`` when it is not INFLIGHT, 409 ``stale_receipt`` when the receipt
    is not its current claim's (nothing changes)."""
    extended = jobs_extend(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]],
                           incremental_timeout=incremental_timeout, receipt=receipt)
    if ctx.job[0] not in extended:
        current = query_fetchone(Q.job_claim_state, {"job": ctx.job[0], "consumer": ctx.consumer_pk}) \
            if receipt is not None else None
        if current is not None and current[1] != receipt:
            raise Conflict("stale_receipt", f"{STALE_DETAIL} (the job is {STATUS_NAMES.get(current[0])})")
        raise Conflict("job_not_inflight", "job is not INFLIGHT")
    deadline, retry = extended[ctx.job[0]]
    return {"ID": job_xid(ctx.job[0]), "Status": "INFLIGHT", "Deadline": rfc3339(deadline), "RetryCount": retry}


def jobs_ack_inflight(*, consumer_pk: int, job_ids: Sequence[int], to_statuses: Sequence[int],
                      delays: Sequence[float | None], max_retry: int, reason: str = "ack",
                      receipts: Sequence[int | None] | None = None) -> dict[int, tuple]:
    """A pull consumer's outcomes for many in-flight jobs in one statement (the batch ack):
    INFLIGHT -> DELIVERED / DEAD, or QUEUED (negative acknowledgement: retry + 1, due after the
    delay, DEAD past ``max_retry``; waiting pulls are notified). Guarded by INFLIGHT, the consumer
    and, for a job given a receipt, its current claim's receipt. Returns {job_id: (moved, status,
    retry_count, receipt)}: for a job that did not move, ``status``, ``retry_count`` and ``receipt``
    are its current ones (None when it is not this consumer's)."""
    transitions_check((INFLIGHT, to_status) for to_status in to_statuses)
    if not job_ids:
        return {}
    rows = query_fetchall(Q.ack, {
        "ids": list(job_ids), "to_s": list(to_statuses), "delay": list(delays), "consumer": consumer_pk,
        "max_retry": int(max_retry), "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT,
        "reason": reason[:32], "receipts": list(receipts) if receipts is not None else [None] * len(job_ids),
    }, prepare=True)
    settle_on_commit(r[5] for r in rows if r[1] is not None and r[1] != QUEUED)
    return {r[0]: (True, r[1], r[2], None) if r[1] is not None else (False, r[3], r[7], r[6]) for r in rows}


def jobs_extend(*, consumer_pk: int, job_ids: Sequence[int], incremental_timeout: float | None = None,
                connection_timeout: float | None = None, receipt: int | None = None) -> dict[int, tuple]:
    """Work in progress: push the deadline of in-flight jobs to now + stopTimeout + rationalDelay +
    IncrementalTimeout (never earlier than it was). Not a transition: status and retry count stay.
    With ``receipt``, only a job whose current claim it is. Returns {job_id: (deadline, retry_count)}
    for the jobs that are INFLIGHT and the consumer's."""
    if not job_ids:
        return {}
    rows = query_fetchall(Q.extend, {"ids": list(job_ids), "inflight": INFLIGHT, "consumer": consumer_pk,
                                     "timeout": inflight_timeout(0, connection_timeout),
                                     "inc": incremental_timeout, "receipt": receipt}, prepare=True)
    return {row[0]: (row[1], row[2]) for row in rows}
