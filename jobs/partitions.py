"""Partitions with gates: ordered fan-out / fan-in per consumer, push leases, work stealing.

A message published with ``X-Broker-Partition-Key`` (and ``X-Broker-Gate``, default 0) gives each
consumer of its channel a job in that consumer's partition of the key, at that gate. Only jobs at the
partition's current gate are claimable (the claims in ``jobs/queries.sql``); when every job there is
DELIVERED the partition advances to the next gate that has jobs (``partition_settle``). A DEAD job
at the current gate marks the partition FAILED until it is requeued (resumes) or skipped.

Every write of a partition row is optimistic: ``UPDATE ... WHERE id = %s AND version = %s`` with
``version = version + 1``; a lost race re-reads and retries (bounded), never overwrites. Push
workers lease partitions (owner = worker id, ``lease_until`` from the database clock) like a
change-feed processor: each takes free or expired partitions up to its fair share, then steals at
most one per cycle from the most loaded owner above the fair share. A lease is only taken while
none of the partition's jobs is in flight, under the push claim lock, so a job is never delivered
by one worker while another holds its partition's lease.

Service functions are keyword-only and take a partition pk or ``consumer_pk`` + ``key`` (the
admin uses them too); each returns what it did.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.db.run import query_execute, query_fetchall, query_fetchone
from broker.errors import Conflict, NotFound
from jobs.advisories import advisory_record
from jobs.locks import PUSH_CLAIM_LOCK
from jobs.models import JobStatus, PartitionStatus
from jobs.queries import Q

logger = logging.getLogger(__name__)

QUEUED, INFLIGHT, DELIVERED, DEAD = (JobStatus.QUEUED.value, JobStatus.INFLIGHT.value,
                                     JobStatus.DELIVERED.value, JobStatus.DEAD.value)
AVAILABLE, FAILED, COMPLETE = (PartitionStatus.AVAILABLE.value, PartitionStatus.FAILED.value,
                               PartitionStatus.COMPLETE.value)
STATUS_NAMES = {AVAILABLE: "AVAILABLE", FAILED: "FAILED", COMPLETE: "COMPLETE"}
JOB_STATUS_NAMES = {QUEUED: "QUEUED", INFLIGHT: "INFLIGHT", DELIVERED: "DELIVERED", DEAD: "DEAD"}
OCC_RETRIES = 50
KEY_MAX = 255


def lease_seconds() -> float:
    """``BROKER_PARTITION_LEASE_SECONDS`` (default 10): a push worker's lease on a partition;
    renewed when a third of it has passed."""
    value = getattr(settings, "BROKER_PARTITION_LEASE_SECONDS", None)
    if value is None:
        value = os.environ.get("BROKER_PARTITION_LEASE_SECONDS") or 10.0
    return max(0.3, float(value))


# --- reading ------------------------------------------------------------------------------------

@dataclass
class Row:
    id: int
    consumer_pk: int
    key: str
    gate: int
    status: int
    version: int
    closed: bool
    auto_close: bool
    manual_checkpoint: bool
    owner: str
    lease_until: object
    created_at: object
    updated_at: object
    consumer_id: str
    channel_id: str
    leased: bool
    completed_at: object = None


def _row(*, partition_pk: int | None = None, consumer_pk: int | None = None, key: str | None = None) -> Row | None:
    if partition_pk is not None:
        r = query_fetchone(Q.partition_row, [partition_pk])
    else:
        r = query_fetchone(Q.partition_row_by_key, [consumer_pk, key])
    return Row(*r[:15], leased=bool(r[15]), completed_at=r[16]) if r else None


def partition_require(partition_pk=None, consumer_pk=None, key=None) -> Row:
    row = _row(partition_pk=partition_pk, consumer_pk=consumer_pk, key=key)
    if row is None:
        raise NotFound("partition_not_found", "partition not found")
    return row


def _counts(partition_pk: int, from_gate: int = 0) -> dict[tuple[int, int], int]:
    """{(gate, status): n} of the partition's jobs at ``from_gate`` or above (the partial index
    ``job_partition_gate``: a bounded scan of one partition, never of the job table)."""
    return {(g, s): n for g, s, n in query_fetchall(Q.partition_counts, [partition_pk, from_gate])}


def counts_repr(counts: dict[tuple[int, int], int]) -> dict:
    """{"<gate>": {"QUEUED": n, ...}} for the API and advisories, plus totals."""
    per_gate: dict[str, dict] = {}
    totals = {name: 0 for name in JOB_STATUS_NAMES.values()}
    for (gate, status), n in sorted(counts.items()):
        name = JOB_STATUS_NAMES.get(status, str(status))
        per_gate.setdefault(str(gate), {})[name] = n
        totals[name] = totals.get(name, 0) + n
    return {"gates": per_gate, "total": totals}


def partition_repr(row: Row, *, counts: bool = True) -> dict:
    def ts(v):
        return v.isoformat().replace("+00:00", "Z") if v is not None else None

    body = {
        "key": row.key, "consumer": row.consumer_id, "channel": row.channel_id, "gate": row.gate,
        "status": STATUS_NAMES.get(row.status, str(row.status)), "closed": row.closed,
        "autoClose": row.auto_close, "manualCheckpoint": row.manual_checkpoint,
        "owner": row.owner or None, "leaseUntil": ts(row.lease_until) if row.owner else None,
        "leased": bool(row.owner) and row.leased, "version": row.version,
        "createdAt": ts(row.created_at), "updatedAt": ts(row.updated_at), "completedAt": ts(row.completed_at),
    }
    if counts:
        c = counts_repr(_counts(row.id))
        body["counts"] = c["gates"]
        body["totals"] = c["total"]
    return body


def partition_get(*, consumer_pk: int | None = None, key: str | None = None,
                  partition_pk: int | None = None) -> dict:
    """A partition with its counts per gate and status (NotFound for an unknown one)."""
    return partition_repr(partition_require(partition_pk, consumer_pk, key))


# --- settle (the OCC state change after job moves) -------------------------------------------------

@dataclass
class Settled:
    partition_pk: int
    gate: int
    status: int
    version: int
    changed: bool
    attempts: int


def _next_state(row: Row, counts: dict) -> tuple[int, int]:
    """The partition's (gate, status) implied by its jobs. FAILED while a job at the current gate
    is DEAD; else AVAILABLE, advanced past finished gates (unless manual checkpoint); COMPLETE when
    nothing is left and the partition is closed or auto-closing."""
    gate, status = row.gate, row.status
    if status == COMPLETE:
        return gate, status
    while True:
        if counts.get((gate, DEAD), 0):
            return gate, FAILED
        status = AVAILABLE
        if counts.get((gate, QUEUED), 0) or counts.get((gate, INFLIGHT), 0):
            return gate, status
        higher = sorted({g for (g, s), n in counts.items() if g > gate and s != DELIVERED and n})
        if higher:
            if row.manual_checkpoint:
                return gate, status
            gate = higher[0]
            continue
        if row.closed or row.auto_close:
            return gate, COMPLETE
        return gate, status


def _notify(consumer_pk: int) -> None:
    """Wake waiting pulls and push dispatchers (delivered on commit, like publish's NOTIFY)."""
    query_execute(Q.jobs_notify, [str(consumer_pk)])


def _advise(row: Row, type_: str, gate: int) -> None:
    counts = counts_repr(_counts(row.id))
    advisory_record(type=type_, channel=row.channel_id, consumer=row.consumer_id, consumer_pk=row.consumer_pk,
                    data={"key": row.key, "gate": gate, "counts": counts["total"], "gates": counts["gates"]})


def partition_settle(*, partition_pk: int) -> Settled | None:
    """Recompute one partition from its jobs' per-gate counts and write the result with the
    version check (re-read and retry on a lost race). Records ``partition_failed`` /
    ``partition_complete`` advisories and wakes the consumer's waiters when jobs became
    claimable. None for an unknown partition."""
    for attempt in range(1, OCC_RETRIES + 1):
        with transaction.atomic():
            row = _row(partition_pk=partition_pk)
            if row is None:
                return None
            if row.status == COMPLETE:
                return Settled(row.id, row.gate, row.status, row.version, False, attempt)
            if row.status == AVAILABLE:
                dead, busy = query_fetchone(Q.partition_gate_busy, [row.id, row.gate, row.id, row.gate])
                if busy and not dead:  # what _next_state would answer: unchanged
                    return Settled(row.id, row.gate, row.status, row.version, False, attempt)
            counts = _counts(row.id, row.gate)
            gate, status = _next_state(row, counts)
            if (gate, status) == (row.gate, row.status):
                return Settled(row.id, gate, status, row.version, False, attempt)
            written = query_fetchone(Q.partition_settle_write,
                                     [gate, status, status, status, status, row.id, row.version])
            if written is None:
                continue  # someone wrote first: re-read, never overwrite
            if status == FAILED:
                _advise(row, "partition_failed", gate)
            elif status == COMPLETE:
                _advise(row, "partition_complete", gate)
            if status == AVAILABLE:
                _notify(row.consumer_pk)
            return Settled(row.id, gate, status, written[0], True, attempt)
    logger.warning("partition %s: settle lost %d races in a row; the next move settles it", partition_pk,
                   OCC_RETRIES)
    return None


def partitions_settle(*, partition_ids) -> list[Settled]:
    """Settle each partition (called after commit of the job moves, see jobs.state)."""
    out = []
    for pk in sorted(set(partition_ids)):
        try:
            result = partition_settle(partition_pk=pk)
        except Exception:  # noqa: BLE001 - the sweep (partitions_settle_stale) settles it later
            logger.exception("partition %s: settle failed", pk)
            continue
        if result is not None:
            out.append(result)
    return out


STALE_EVERY = 10.0  # seconds between safety-net settles in one process
_stale_next = 0.0


def partitions_settle_stale(*, limit: int = 100, force: bool = False) -> int:
    """Safety net (run with the dispatcher's timeout sweep, at most every ``STALE_EVERY`` seconds
    per process): settle partitions a settle would change, in case a settle after commit was lost
    (its process died between the commit and the settle). Returns how many changed."""
    global _stale_next
    if not force and time.monotonic() < _stale_next:
        return 0
    _stale_next = time.monotonic() + STALE_EVERY
    ids = [r[0] for r in query_fetchall(Q.partitions_stale, [limit])]
    return sum(1 for s in partitions_settle(partition_ids=ids) if s.changed)


# --- operator / API actions -------------------------------------------------------------------------

_WRITABLE = {"gate", "status", "closed", "auto_close", "manual_checkpoint"}


def partition_write(*, partition_pk: int, version: int, **fields) -> int | None:
    """The optimistic write every change of a partition is: set ``fields`` (gate, status, closed,
    auto_close, manual_checkpoint) if the row is still at ``version``. Returns the new version, or
    None when another writer got there first (re-read and decide again; never overwrite)."""
    unknown = set(fields) - _WRITABLE
    if unknown:
        raise ValueError(f"not writable: {sorted(unknown)}")
    r = query_fetchone(Q.partition_write, {**dict.fromkeys(_WRITABLE), **fields, "id": partition_pk,
                                           "version": version})
    return r[0] if r else None



def _occ(partition_pk, consumer_pk, key, change) -> dict:
    """Run ``change(row) -> {field: value} | None`` (``partition_write``'s fields) with the version
    check, retrying lost races; then settle and answer the partition."""
    for _ in range(OCC_RETRIES):
        with transaction.atomic():
            row = partition_require(partition_pk, consumer_pk, key)
            update = change(row)
            if update is None or partition_write(partition_pk=row.id, version=row.version, **update) is not None:
                break
    else:
        raise Conflict("version_conflict", "the partition changed concurrently too often; try again")
    partition_settle(partition_pk=row.id)
    return partition_repr(partition_require(row.id))


def partition_close(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None) -> dict:
    """The producer says no more items: the partition completes once all its jobs are delivered,
    and later publishes to the key are refused (409 ``partition_closed``)."""
    return _occ(partition_pk, consumer_pk, key, lambda row: None if row.closed else {"closed": True})


def partition_update(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None,
                     auto_close: bool | None = None, manual_checkpoint: bool | None = None) -> dict:
    """Set ``auto_close`` / ``manual_checkpoint`` (None leaves a flag as it is)."""
    def change(row):
        fields = {}
        if auto_close is not None and auto_close != row.auto_close:
            fields["auto_close"] = bool(auto_close)
        if manual_checkpoint is not None and manual_checkpoint != row.manual_checkpoint:
            fields["manual_checkpoint"] = bool(manual_checkpoint)
        return fields or None

    return _occ(partition_pk, consumer_pk, key, change)


def partition_advance(*, consumer_pk: int | None = None, key: str | None = None,
                      partition_pk: int | None = None) -> dict:
    """Manual checkpoint: move an AVAILABLE partition whose current gate is finished (nothing
    QUEUED, INFLIGHT or DEAD there) to the next gate that has jobs. 409 ``gate_not_finished``
    while work remains at the current gate, ``partition_not_available`` when FAILED/COMPLETE,
    ``no_next_gate`` when no higher gate has jobs."""
    def change(row):
        if row.status != AVAILABLE:
            raise Conflict("partition_not_available",
                           f"partition is {STATUS_NAMES[row.status]}; only AVAILABLE partitions advance")
        counts = _counts(row.id, row.gate)
        if any(counts.get((row.gate, s), 0) for s in (QUEUED, INFLIGHT, DEAD)):
            raise Conflict("gate_not_finished", f"jobs at gate {row.gate} are not all delivered")
        higher = sorted({g for (g, s), n in counts.items() if g > row.gate and s != DELIVERED and n})
        if not higher:
            raise Conflict("no_next_gate", "no higher gate has jobs")
        return {"gate": higher[0]}

    body = _occ(partition_pk, consumer_pk, key, change)
    row = partition_require(partition_pk, consumer_pk, key)
    _notify(row.consumer_pk)
    return body



# --- publish (called by jobs.publishing in the publish transaction) -----------------------

def partitions_for_publish(*, channel_pk: int, gates_by_key: dict[str, list[int]]) -> list[int]:
    """Create or touch each consumer's partition of every key (one INSERT .. ON CONFLICT; a touch
    is a versioned write, so a settle that counted before this publish loses its race and
    recounts) and refuse what could never run: 409 ``partition_closed`` for a closed partition,
    409 ``gate_passed`` for a gate below the partition's current one. A COMPLETE partition that
    was not closed (auto-close) is reopened. Returns the partition ids to settle after the jobs
    are inserted (those whose current gate is below a published gate)."""
    keys = sorted(gates_by_key)
    rows = query_fetchall(Q.partitions_upsert, {"channel": channel_pk, "keys": keys,
                                                 "gates": [min(gates_by_key[k]) for k in keys]})
    settle = []
    for pk, _consumer, key, gate, status, closed in rows:
        if closed:
            raise Conflict("partition_closed", f"partition {key!r} is closed")
        low = min(gates_by_key[key])
        if low < gate:
            raise Conflict("gate_passed", f"partition {key!r} is at gate {gate}; gate {low} could never run")
        if max(gates_by_key[key]) > gate:
            settle.append(pk)
    return settle


# --- push leases ----------------------------------------------------------------------------------

@dataclass
class LeaseCycle:
    renewed: int = 0
    released: int = 0
    taken: int = 0
    stolen: int = 0
    owned: int = 0
    fair_share: int = 0
    writes: list = field(default_factory=list)  # (partition pk, new version) of every row written


def partition_leases_cycle(*, worker: str, lease: float | None = None, acquire: bool = True,
                           candidates: int = 1000) -> LeaseCycle:
    """One lease cycle of push worker ``worker``: renew own leases older than a third of the
    lease, give back idle ones, then (``acquire``) take free or expired partitions with work up to
    the fair share (partitions with work / live owners, this worker included) and steal at most
    one from the most loaded owner above it. Every write is version-checked; time is ``now()``.

    Takes the push claim lock (jobs.state.PUSH_CLAIM_LOCK) only when there is something to take,
    so a claim never runs between the "nothing in flight" check and the takeover; a first look
    without the lock keeps the usual cycle (nothing to take) from ever delaying a claim."""
    lease = lease_seconds() if lease is None else float(lease)
    out = LeaseCycle()
    params = {"worker": worker, "lease": lease, "renew_before": lease * 2.0 / 3.0}

    def plan(cur):
        cur.execute(Q.leases_owners.sql)
        owners = dict(cur.fetchall())
        cur.execute(Q.partitions_free.sql, {"limit": candidates})
        free = cur.fetchall()
        mine = owners.get(worker, 0)
        total = sum(owners.values()) + len(free)
        fair = math.ceil(total / len(set(owners) | {worker})) if total else 0
        victims = sorted(((n, o) for o, n in owners.items() if o != worker and n > fair), reverse=True)
        return owners, free, mine, fair, victims

    with transaction.atomic(), connection.cursor() as cur:
        owners, free, mine, fair, victims = plan(cur) if acquire else ({}, [], 0, 0, [])
        take = acquire and mine < fair and (free or victims)
        if take:  # first, before any partition row lock: one lock order (lock, rows) for every cycle
            cur.execute(Q.push_claim_lock.sql, [PUSH_CLAIM_LOCK])
        cur.execute(Q.leases_renew.sql, params)
        out.writes += cur.fetchall()
        out.renewed = len(out.writes)
        cur.execute(Q.leases_release_idle.sql, params)
        released = cur.fetchall()
        out.writes += released
        out.released = len(released)
        if not take:
            out.owned, out.fair_share = mine, fair
            return out
        owners, free, mine, fair, victims = plan(cur)  # again, under the lock: what counts
        out.fair_share = fair
        want = fair - mine
        if want > 0 and free:
            random.shuffle(free)  # concurrent workers rarely fight over the same rows
            pick = sorted(free[:want])  # id order: the lock order of every multi-row partition write
            cur.execute(Q.leases_take.sql, {**params, "ids": [p[0] for p in pick], "versions": [p[1] for p in pick]})
            taken = cur.fetchall()
            out.writes += taken
            out.taken = len(taken)
            mine += out.taken
        if mine < fair and victims:
            cur.execute(Q.lease_steal_candidate.sql, {"victim": victims[0][1]})
            cand = cur.fetchone()
            if cand is not None:
                cur.execute(Q.leases_take.sql, {**params, "ids": [cand[0]], "versions": [cand[1]]})
                stolen = cur.fetchall()
                out.writes += stolen
                out.stolen = len(stolen)
                mine += out.stolen
        out.owned = mine
    return out


def partition_leases_release(*, worker: str) -> int:
    """Give back every lease of ``worker`` (clean shutdown). Returns how many."""
    return len(query_fetchall(Q.leases_release_all, {"worker": worker}))
