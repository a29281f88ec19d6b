"""Pull claims (QUEUED -> INFLIGHT, SKIP LOCKED, within the consumer's room) and deadline
extensions of claimed jobs: ``claim_pull``, ``claim_pull_bytes`` and ``extend`` in jobs/queries.sql."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from broker.db.run import query_fetchall
from jobs.queries import Q
from jobs.retries import inflight_timeout
from jobs.transitions import INFLIGHT, QUEUED, transition_check


def headers_decode(value) -> dict:
    """A message's headers as a dict: jsonb comes back as text through Django's connection (its
    JSONField decodes itself); anything but a JSON object reads as no headers."""
    if isinstance(value, (str, bytes)):
        value = json.loads(value) if value and value != "{}" else {}
    return value if isinstance(value, dict) else {}


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


def claimed_jobs(rows) -> list[ClaimedJob]:
    """Rows shaped like ``claim_pull``'s result (id, priority, retry_count, incremental_timeout,
    deadline, message_id, payload, content_type, headers[, partition key, gate[, type]]) as ClaimedJob objects."""
    return [
        ClaimedJob(id=r[0], priority=r[1], retry_count=r[2], incremental_timeout=r[3], deadline=r[4],
                   message_id=r[5], payload=bytes(r[6]), content_type=r[7], headers=headers_decode(r[8]),
                   partition_key=r[9] if len(r) > 9 else None, gate=r[10] if len(r) > 10 and r[10] else 0,
                   message_type=r[11] if len(r) > 11 else None)
        for r in rows
    ]


def jobs_claim(*, consumer_pk: int, limit: int, incremental_timeout: float | None = None,
               connection_timeout: float | None = None, reason: str = "claim") -> list[ClaimedJob]:
    """Claim up to ``limit`` due QUEUED jobs of one consumer (priority, then oldest first), within
    the consumer's room (not paused, ``maxAckPending``).

    One prepared statement (pulls claim in many small statements, where planning would cost more
    than the claim): ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the rows, the UPDATE moves them
    to INFLIGHT with a deadline of stopTimeout + rationalDelay + IncrementalTimeout (an omitted
    IncrementalTimeout keeps the job's stored one), and the history rows are appended.
    """
    transition_check(QUEUED, INFLIGHT, "claim")
    if limit <= 0:
        return []
    rows = query_fetchall(Q.claim_pull, {
        "consumer": consumer_pk, "limit": int(limit), "queued": QUEUED, "inflight": INFLIGHT,
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
    }, prepare=True)
    return claimed_jobs(rows)


def jobs_claim_within_bytes(*, consumer_pk: int, limit: int, max_bytes: int,
                            incremental_timeout: float | None = None, connection_timeout: float | None = None,
                            reason: str = "claim") -> list[ClaimedJob]:
    """Like ``jobs_claim``, but stop before the payloads add up to more than ``max_bytes``
    (always at least one job, so one large payload cannot block the consumer). One statement:
    the candidates are locked with SKIP LOCKED, the running payload sum (from the stored size,
    no detoasting) cuts the prefix that fits, and only that prefix moves to INFLIGHT."""
    if limit <= 0:
        return []
    params = {
        "consumer": consumer_pk, "limit": int(limit), "max_bytes": int(max_bytes),
        "queued": QUEUED, "inflight": INFLIGHT,
        "timeout": inflight_timeout(0, connection_timeout), "inc": incremental_timeout, "reason": reason,
    }
    transition_check(QUEUED, INFLIGHT, "claim")
    rows = query_fetchall(Q.claim_pull_bytes, params, prepare=True)
    return claimed_jobs(rows)


def jobs_extend(*, consumer_pk: int, job_ids: Sequence[int], incremental_timeout: float | None = None,
                connection_timeout: float | None = None) -> dict[int, tuple]:
    """Work in progress: push the deadline of in-flight jobs to now + stopTimeout + rationalDelay +
    IncrementalTimeout (never earlier than it was). Not a transition: status and retry count stay.
    Returns {job_id: (deadline, retry_count)} for the jobs that are INFLIGHT and the consumer's."""
    if not job_ids:
        return {}
    rows = query_fetchall(Q.extend, {"ids": list(job_ids), "inflight": INFLIGHT, "consumer": consumer_pk,
                                        "timeout": inflight_timeout(0, connection_timeout),
                                        "inc": incremental_timeout}, prepare=True)
    return {row[0]: (row[1], row[2]) for row in rows}
