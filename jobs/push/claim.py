"""The push claim: due QUEUED jobs across every push consumer within ``maxInFlight`` and the pacing
of ``maxDeliveriesPerSecond`` (``claim_push``), taken under the push claim lock so two dispatchers
never fill the same free slot."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from django.conf import settings
from psycopg.types.json import Jsonb
from django.db import transaction

from broker.db.run import array_literal, bound_cursor, transition_errors
from broker.tracing import TraceContext
from jobs.partitions.leases import push_claims_serialize
from jobs.publish.messages import headers_decode
from jobs.push.queries import Q
from jobs.state import floors
from jobs.state.transitions import INFLIGHT, QUEUED, transition_check

# Run first in a push dispatcher's transaction (record outcomes + claim), measured on the 2-core
# machine (median claim of 10 jobs: 2.1 ms planned every time, 1.1 ms prepared and generic):
# - plan_cache_mode: reuse the prepared generic plans (PostgreSQL otherwise keeps re-planning
#   these statements, as its cost estimate favours custom plans); the statuses are inlined in the
#   SQL so the generic plans still use the partial indexes.
# - synchronous_commit off: claims and outcomes need no WAL flush before the dispatcher goes on.
#   If a crash loses the last few milliseconds of them, those jobs are QUEUED or INFLIGHT again
#   and are delivered (again): at-least-once holds, and no message is lost (publishing commits
#   synchronously).
PUSH_TRANSACTION_SETUP = Q.push_transaction_setup.sql
# psycopg's own timestamptz loader (C, with psycopg-binary) for the claim's rows: Django registers a
# Python subclass on its connections (to set the time zone), which cost ~10 % of a dispatcher's CPU
# on the consumer's ``updated_at`` of every claimed row. Only compared with the cached one (equal
# instants are equal whatever the zone).
_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


@dataclass
class PushJob:
    id: int
    consumer_pk: int
    priority: int
    retry_count: int
    message_id: str
    payload: bytes
    content_type: str
    headers: dict
    consumer_updated_at: object
    partition_key: str | None = None
    gate: int = 0
    message_type: str | None = None  # filters: sent as X-Broker-Message-Type
    circuit_dirty: bool = False  # its consumer's circuit was counting failures or open when claimed
    trace: TraceContext | None = None  # the message's traceparent / tracestate (broker.tracing)
    room: int | None = None  # its consumer's room at this claim (all of it taken: the consumer is saturated)
    waited: float | None = None  # seconds it waited, due, until this claim (jobs.push.lag)


def jobs_claim_push(*, limit: int, reason: str = "push", worker: str = "", caps: FairCaps | None = None,
                    owner: int | None = None) -> list[PushJob]:
    """Claim up to ``limit`` due QUEUED jobs across every push consumer: priority DESC, then
    oldest first, never past a consumer's ``maxInFlight`` (counted over all processes) or its
    ``maxDeliveriesPerSecond`` pacing. Moves them to INFLIGHT with a deadline of the consumer's
    stopTimeout + rationalDelay.

    Race-free by a transaction-level advisory lock taken *before* the claim statement: push
    claims run one at a time database-wide, and each one's fresh READ COMMITTED snapshot sees
    every earlier claim, so two dispatchers never both fill the same free slot (a single
    statement could not: its snapshot predates any lock it waits for). A claim takes about a
    millisecond, so the serialization costs nothing at our rates; acks need no lock (they only
    free room). Pull consumers' jobs are never touched (``type = 'push'``).

    Runs in the caller's transaction when there is one (the dispatcher records the previous
    batch's outcomes and claims the next in one transaction). Partitioned jobs only of
    partitions ``worker`` holds a live lease on (jobs.partitions). ``caps``: the claiming loop's
    fair shares (``fair_caps``); none: every consumer may take up to ``limit``.
    """
    transition_check(QUEUED, INFLIGHT, "claim")
    if caps is not None:
        limit = min(limit, caps.limit)
    if limit <= 0:
        return []
    began = time.monotonic()
    walks: dict[int, tuple[int, bool, bool]] = {}  # consumer pk: (its floor's level, full fresh walk, full retry walk)
    params = {
        "limit": int(limit),
        "conn_timeout": float(settings.BROKER_CONNECTION_TIMEOUT),
        "rational": float(settings.BROKER_RATIONAL_DELAY),
        "reason": reason[:32],
        "worker": worker or "",
        "lag": floors.LAG,
        "owner": owner,  # the claiming engine (jobs.push.owners); None: the claims outlive nobody's check
        "ids": array_literal([] if caps is None else caps.consumers),
        "caps": array_literal([] if caps is None else caps.caps),
    }
    given = []
    for pk in set(floors.CLAIM_PUSH.keys()) | set(floors.RETRIES_PUSH.keys()):
        (level, first), full = floors.CLAIM_PUSH.position(pk, began)
        since, full_retries = floors.RETRIES_PUSH.time(pk, began)
        walks[pk] = (level, full, full_retries)
        given.append({"consumer_id": pk, "fp": level, "fi": first, "ft": since.isoformat() if since else None})
    params["floors"] = Jsonb(given)
    with transaction.atomic(savepoint=False), transition_errors(), bound_cursor() as cur:
        cur.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)
        push_claims_serialize(cur, prepare=True)
        cur.execute(Q.claim_push.sql, params, prepare=True)
        rows = cur.fetchall()
    jobs = []
    for r in rows:
        if r[0] is None:  # a walked consumer's next floors (jobs.state.floors)
            level, full, full_retries = walks.get(r[1], (floors.FULL[0], True, True))
            floors.CLAIM_PUSH.walked(r[1], began=began, full=full, level=level,
                                     first=(r[16], r[17]) if r[17] is not None else None, sequence=r[18])
            floors.RETRIES_PUSH.walked(r[1], began=began, full=full_retries, value=r[19])
            continue
        jobs.append(PushJob(id=r[0], consumer_pk=r[1], priority=r[2], retry_count=r[3], message_id=r[4],
                            payload=bytes(r[5]), content_type=r[6], consumer_updated_at=r[8],
                            partition_key=r[9], gate=r[10] or 0, message_type=r[11], circuit_dirty=r[12],
                            headers=headers_decode(r[7]), trace=TraceContext(r[13] or "", r[14] or ""), room=r[15],
                            waited=r[20]))
    return jobs


def saturation_update(saturated: set[int], jobs: list[PushJob]) -> None:
    """Which consumers are saturated after a claim: those it gave all of their room (more of their
    jobs may wait for room). A consumer with no job in the claim stays as it was: with no room at
    all it got none."""
    claimed: dict[int, list] = {}  # consumer pk: [jobs claimed, its room]
    for job in jobs:
        claimed.setdefault(job.consumer_pk, [0, job.room])[0] += 1
    for pk, (count, room) in claimed.items():
        if room is not None and count >= room:
            saturated.add(pk)
        else:
            saturated.discard(pk)


SATURATED_RECHECK = 0.005  # seconds: how soon a held loop looks again at a saturated consumer's outcomes


def window_hold(*, last: float, window: float, now: float, saturated: set[int], delivered: dict[int, int],
                inflight: dict[int, int]) -> float:
    """Seconds a dispatcher loop holds its next record-and-claim transaction: the rest of the window
    since its last one, or none when a saturated consumer (its room is what it waits for) has at
    least as many deliveries to record as callbacks still in flight in the loop (half of its room or
    more is back: one transaction for them, not one per callback as they come back); a saturated
    consumer with fewer is looked at again within ``SATURATED_RECHECK``. ``delivered``: deliveries
    to record per consumer; ``inflight``: callbacks in flight in the loop per consumer. A failed
    attempt never cuts the window short: an endpoint that fails at once, held to one call at a time
    by its circuit breaker, would otherwise have the loop record and claim after every call."""
    rest = max(0.0, last + window - now)
    if rest <= 0.0:
        return 0.0
    waiting = False
    for pk, n in delivered.items():
        if pk in saturated:
            if n >= inflight.get(pk, 0):
                return 0.0
            waiting = True
    return min(rest, SATURATED_RECHECK) if waiting else rest


@dataclass
class FairCaps:
    """A loop's fair shares of its callbacks for one claim: at most ``limit`` jobs in all (so at most
    that many for a consumer with nothing in flight in the loop), at most ``caps`` for those in
    ``consumers`` (the same order)."""

    limit: int
    consumers: list[int]
    caps: list[int]


def fair_share(*, inflight: dict[int, int], size: int) -> int:
    """The most callbacks one consumer may have in flight in a loop of ``size``: an equal share of
    the loop among the consumers with callbacks in flight and one more (room is always left for a
    consumer with nothing in flight), or half of what is free when that is more (room nobody uses is
    not kept back). A consumer whose endpoint hangs keeps what it took, and gets no more."""
    active = sum(1 for n in inflight.values() if n > 0)
    free = size - sum(inflight.values())
    return max(1, size // (active + 1), free // 2)


def fair_caps(*, inflight: dict[int, int], size: int, limit: int) -> FairCaps:
    """The next claim of a loop of ``size`` callbacks: each consumer with callbacks in flight there
    up to its fair share (``fair_share``) less those; a claim takes at most half of what is free,
    so the consumers that come after find room too whatever the endpoints before them do (hanging
    endpoints one after the other take a half, a quarter, ... of the loop, never all of it). Only
    consumers whose cap is below the claim's limit are listed."""
    share = fair_share(inflight=inflight, size=size)
    limit = max(1, min(limit, (size - sum(inflight.values())) // 2))
    consumers, caps = [], []
    for pk, n in inflight.items():
        if n > 0 and share - n < limit:
            consumers.append(pk)
            caps.append(max(0, share - n))
    return FairCaps(limit=limit, consumers=consumers, caps=caps)
