"""Partitions with gates: ordered fan-out / fan-in per consumer, push leases, work stealing.

A message published with ``X-Broker-Partition-Key`` (and ``X-Broker-Gate``, default 0) gives each
consumer of its channel a job in that consumer's partition of the key, at that gate. Only jobs at the
partition's current gate are claimable (``jobs.state.partition_gate_sql``); when every job there is
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
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.errors import Conflict, NotFound
from jobs.models import JobStatus, PartitionStatus

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

_ROW_SQL = """
SELECT p.id, p.consumer_id, p.key, p.gate, p.status, p.version, p.closed, p.auto_close,
       p.manual_checkpoint, p.owner, p.lease_until, p.created_at, p.updated_at,
       c.consumer_id, ch.channel_id, p.lease_until > now(), p.completed_at
  FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
  JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE {WHERE}
"""


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
    with connection.cursor() as cur:
        if partition_pk is not None:
            cur.execute(_ROW_SQL.replace("{WHERE}", "p.id = %s"), [partition_pk])
        else:
            cur.execute(_ROW_SQL.replace("{WHERE}", "p.consumer_id = %s AND p.key = %s"), [consumer_pk, key])
        r = cur.fetchone()
    return Row(*r[:15], leased=bool(r[15]), completed_at=r[16]) if r else None


def _require(partition_pk=None, consumer_pk=None, key=None) -> Row:
    row = _row(partition_pk=partition_pk, consumer_pk=consumer_pk, key=key)
    if row is None:
        raise NotFound("partition_not_found", "partition not found")
    return row


# served by job_partition_gate (partition, gate, status)
_COUNTS_SQL = ("SELECT gate, status, count(*) FROM jobs_job WHERE partition_id = %s AND gate >= %s "
               "GROUP BY gate, status")


def _counts(partition_pk: int, from_gate: int = 0) -> dict[tuple[int, int], int]:
    """{(gate, status): n} of the partition's jobs at ``from_gate`` or above (the partial index
    ``job_partition_gate``: a bounded scan of one partition, never of the job table)."""
    with connection.cursor() as cur:
        cur.execute(_COUNTS_SQL, [partition_pk, from_gate])
        return {(g, s): n for g, s, n in cur.fetchall()}


# Is the current gate's work under way (a job there QUEUED or INFLIGHT) and none DEAD? Then a settle
# changes nothing for an AVAILABLE partition: the common case after a job finishes, answered by two
# probes of job_partition_gate instead of counting every job of the partition.
_GATE_BUSY_SQL = f"""
SELECT EXISTS (SELECT 1 FROM jobs_job WHERE partition_id = %s AND gate = %s AND status = {DEAD}),
       EXISTS (SELECT 1 FROM jobs_job WHERE partition_id = %s AND gate = %s AND status IN ({QUEUED}, {INFLIGHT}))
"""


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
    return partition_repr(_require(partition_pk, consumer_pk, key))


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


_WRITE_SQL = """
UPDATE jobs_partition SET gate = %s, status = %s, version = version + 1, updated_at = now(),
       owner = CASE WHEN %s = {COMPLETE} THEN '' ELSE owner END,
       lease_until = CASE WHEN %s = {COMPLETE} THEN NULL ELSE lease_until END,
       completed_at = CASE WHEN %s = {COMPLETE} THEN now() END
 WHERE id = %s AND version = %s
RETURNING version
""".format(COMPLETE=COMPLETE)


def _notify(consumer_pk: int) -> None:
    """Wake waiting pulls and push dispatchers (delivered on commit, like publish's NOTIFY)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify('broker_jobs', %s)", [str(consumer_pk)])


def _advise(row: Row, type_: str, gate: int) -> None:
    from jobs.advisories import advisory_record

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
                with connection.cursor() as cur:
                    cur.execute(_GATE_BUSY_SQL, [row.id, row.gate, row.id, row.gate])
                    dead, busy = cur.fetchone()
                if busy and not dead:  # what _next_state would answer: unchanged
                    return Settled(row.id, row.gate, row.status, row.version, False, attempt)
            counts = _counts(row.id, row.gate)
            gate, status = _next_state(row, counts)
            if (gate, status) == (row.gate, row.status):
                return Settled(row.id, gate, status, row.version, False, attempt)
            with connection.cursor() as cur:
                cur.execute(_WRITE_SQL, [gate, status, status, status, status, row.id, row.version])
                written = cur.fetchone()
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


# Partitions a settle would change (nothing claimable at the current gate, yet: a DEAD job there,
# later gates waiting, a FAILED one whose dead jobs are gone, or all done and closing). Each test
# is a probe of one partition on job_partition_gate ("(SELECT 1 ... LIMIT 1)", which the planner
# cannot turn into a join: as NOT EXISTS it merge-joined every partitioned job of the table).
_HAS = "(SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND {} LIMIT 1) IS NOT NULL"
_STALE_SQL = """
SELECT p.id FROM jobs_partition p
 WHERE p.status IN ({AVAILABLE}, {FAILED}) AND p.updated_at < now() - interval '2 seconds'
   AND NOT {WORK}
   AND CASE WHEN p.status = {FAILED} THEN NOT {DEAD_HERE}
            ELSE {DEAD_HERE}
                 OR (NOT p.manual_checkpoint AND {LATER})
                 OR ((p.closed OR p.auto_close) AND NOT {LEFT})
       END
 ORDER BY p.updated_at LIMIT %s
""".replace("{WORK}", _HAS.format("j.gate = p.gate AND j.status IN ({QUEUED}, {INFLIGHT})")).replace(
    "{DEAD_HERE}", _HAS.format("j.gate = p.gate AND j.status = {DEAD}")).replace(
    "{LATER}", _HAS.format("j.gate > p.gate AND j.status <> {DELIVERED}")).replace(
    "{LEFT}", _HAS.format("j.gate >= p.gate AND j.status <> {DELIVERED}")).format(
    AVAILABLE=AVAILABLE, FAILED=FAILED, QUEUED=QUEUED, INFLIGHT=INFLIGHT, DELIVERED=DELIVERED, DEAD=DEAD)

STALE_EVERY = 10.0  # seconds between safety-net settles in one process
_stale_next = 0.0


def partitions_settle_stale(*, limit: int = 100, force: bool = False) -> int:
    """Safety net (run with the dispatcher's timeout sweep, at most every ``STALE_EVERY`` seconds
    per process): settle partitions a settle would change, in case a settle after commit was lost
    (its process died between the commit and the settle). Returns how many changed."""
    import time

    global _stale_next
    if not force and time.monotonic() < _stale_next:
        return 0
    _stale_next = time.monotonic() + STALE_EVERY
    with connection.cursor() as cur:
        cur.execute(_STALE_SQL, [limit])
        ids = [r[0] for r in cur.fetchall()]
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
    sets = ", ".join(f"{name} = %s" for name in fields) or "gate = gate"
    with connection.cursor() as cur:
        cur.execute(f"UPDATE jobs_partition SET {sets}, version = version + 1, updated_at = now() "
                    "WHERE id = %s AND version = %s RETURNING version", [*fields.values(), partition_pk, version])
        r = cur.fetchone()
    return r[0] if r else None

def _write(row: Row, sets: str, params: list) -> int | None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE jobs_partition SET {sets}, version = version + 1, updated_at = now() "
                    "WHERE id = %s AND version = %s RETURNING version", [*params, row.id, row.version])
        r = cur.fetchone()
    return r[0] if r else None


def _occ(partition_pk, consumer_pk, key, change) -> dict:
    """Run ``change(row) -> (sets, params) | None`` with the version check, retrying lost races;
    then settle and answer the partition."""
    for _ in range(OCC_RETRIES):
        with transaction.atomic():
            row = _require(partition_pk, consumer_pk, key)
            update = change(row)
            if update is None or _write(row, *update) is not None:
                break
    else:
        raise Conflict("version_conflict", "the partition changed concurrently too often; try again")
    partition_settle(partition_pk=row.id)
    return partition_repr(_require(row.id))


def partition_close(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None) -> dict:
    """The producer says no more items: the partition completes once all its jobs are delivered,
    and later publishes to the key are refused (409 ``partition_closed``)."""
    return _occ(partition_pk, consumer_pk, key, lambda row: None if row.closed else ("closed = true", []))


def partition_update(*, consumer_pk: int | None = None, key: str | None = None, partition_pk: int | None = None,
                     auto_close: bool | None = None, manual_checkpoint: bool | None = None) -> dict:
    """Set ``auto_close`` / ``manual_checkpoint`` (None leaves a flag as it is)."""
    def change(row):
        sets, params = [], []
        if auto_close is not None and auto_close != row.auto_close:
            sets.append("auto_close = %s")
            params.append(bool(auto_close))
        if manual_checkpoint is not None and manual_checkpoint != row.manual_checkpoint:
            sets.append("manual_checkpoint = %s")
            params.append(bool(manual_checkpoint))
        return (", ".join(sets), params) if sets else None

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
        return "gate = %s", [higher[0]]

    body = _occ(partition_pk, consumer_pk, key, change)
    row = _require(partition_pk, consumer_pk, key)
    _notify(row.consumer_pk)
    return body


def partition_retry(*, consumer_pk: int | None = None, key: str | None = None,
                    partition_pk: int | None = None) -> dict:
    """Requeue the partition's DEAD jobs (retry count reset, like the DLQ requeue); the partition
    is AVAILABLE again (settled after the requeue). Answers the partition plus ``requeued``."""
    from jobs import state

    row = _require(partition_pk, consumer_pk, key)
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM jobs_job WHERE partition_id = %s AND status = %s", [row.id, DEAD])
        ids = [r[0] for r in cur.fetchall()]
    requeued = state.jobs_requeue_dead(consumer_pk=row.consumer_pk, job_ids=ids, reason="partition-retry") if ids else 0
    partition_settle(partition_pk=row.id)
    return {**partition_repr(_require(row.id)), "requeued": requeued}


def partition_skip(*, consumer_pk: int | None = None, key: str | None = None,
                   partition_pk: int | None = None) -> dict:
    """Give up on the DEAD jobs at the partition's current gate: they are deleted (as the DLQ's
    delete does; their history rows stay), so the gate counts as finished and the partition moves
    on (AVAILABLE, next gate or COMPLETE). Answers the partition plus ``skipped``."""
    from jobs import state

    row = _require(partition_pk, consumer_pk, key)
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM jobs_job WHERE partition_id = %s AND gate = %s AND status = %s",
                    [row.id, row.gate, DEAD])
        ids = [r[0] for r in cur.fetchall()]
    skipped = state.jobs_delete_dead(consumer_pk=row.consumer_pk, job_ids=ids) if ids else 0
    partition_settle(partition_pk=row.id)
    return {**partition_repr(_require(row.id)), "skipped": skipped}


# --- publish (called by jobs.publishing in the publish transaction) -----------------------

_UPSERT_SQL = """
INSERT INTO jobs_partition (consumer_id, key, gate, status, owner, version, closed, auto_close,
                            manual_checkpoint, created_at, updated_at)
SELECT c.id, k.key, k.gate, {AVAILABLE}, '', 0, false, false, false, now(), now()
  FROM consumers_consumer c CROSS JOIN unnest(%(keys)s::text[], %(gates)s::int[]) AS k(key, gate)
 WHERE c.channel_id = %(channel)s
 ORDER BY c.id, k.key  -- one lock order for every publisher: no deadlocks between them
ON CONFLICT (consumer_id, key) DO UPDATE SET
    version = jobs_partition.version + 1, updated_at = now(),
    status = CASE WHEN jobs_partition.status = {COMPLETE} AND NOT jobs_partition.closed
                  THEN {AVAILABLE} ELSE jobs_partition.status END,
    completed_at = CASE WHEN jobs_partition.status = {COMPLETE} AND NOT jobs_partition.closed
                        THEN NULL ELSE jobs_partition.completed_at END
RETURNING id, consumer_id, key, gate, status, closed
""".format(AVAILABLE=AVAILABLE, COMPLETE=COMPLETE)


def partitions_for_publish(*, channel_pk: int, gates_by_key: dict[str, list[int]]) -> list[int]:
    """Create or touch each consumer's partition of every key (one INSERT .. ON CONFLICT; a touch
    is a versioned write, so a settle that counted before this publish loses its race and
    recounts) and refuse what could never run: 409 ``partition_closed`` for a closed partition,
    409 ``gate_passed`` for a gate below the partition's current one. A COMPLETE partition that
    was not closed (auto-close) is reopened. Returns the partition ids to settle after the jobs
    are inserted (those whose current gate is below a published gate)."""
    keys = sorted(gates_by_key)
    with connection.cursor() as cur:
        cur.execute(_UPSERT_SQL, {"channel": channel_pk, "keys": keys,
                                  "gates": [min(gates_by_key[k]) for k in keys]})
        rows = cur.fetchall()
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

_RENEW_SQL = """
UPDATE jobs_partition p SET lease_until = now() + %(lease)s * interval '1 second', version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition
         WHERE owner = %(worker)s AND lease_until > now() AND status = {AVAILABLE}
           AND lease_until < now() + %(renew_before)s * interval '1 second' ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s  -- version-checked
RETURNING p.id, p.version
""".format(AVAILABLE=AVAILABLE)

# Own leases with nothing to do (no QUEUED/INFLIGHT job at the current gate, or no longer
# AVAILABLE) are given back, so fair shares count only partitions with work.
_RELEASE_IDLE_SQL = """
UPDATE jobs_partition p SET owner = '', lease_until = NULL, version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition q
         WHERE q.owner = %(worker)s
           AND (q.status <> {AVAILABLE} OR q.lease_until <= now() OR NOT EXISTS (
                SELECT 1 FROM jobs_job j WHERE j.partition_id = q.id AND j.gate = q.gate
                   AND j.status IN ({QUEUED}, {INFLIGHT}))) ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s
RETURNING p.id, p.version
""".format(AVAILABLE=AVAILABLE, QUEUED=QUEUED, INFLIGHT=INFLIGHT)

_RELEASE_ALL_SQL = """
UPDATE jobs_partition p SET owner = '', lease_until = NULL, version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition WHERE owner = %(worker)s ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s
RETURNING p.id, p.version
"""

_OWNERS_SQL = """
SELECT owner, count(*) FROM jobs_partition
 WHERE owner <> '' AND lease_until > now() GROUP BY owner
"""

# Free or expired AVAILABLE partitions of push consumers with a QUEUED job at the current gate and
# none in flight (a job still in flight belongs to the worker that claimed it: taking the lease
# now could let two workers deliver the partition's jobs at once).
_FREE_SQL = """
SELECT p.id, p.version FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
 WHERE c.type = 'push' AND NOT c.paused AND p.status = {AVAILABLE}
   AND (p.owner = '' OR p.lease_until <= now())
   AND EXISTS (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate AND j.status = {QUEUED})
   AND NOT EXISTS (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                      AND j.status = {INFLIGHT})
 LIMIT %(limit)s
""".format(AVAILABLE=AVAILABLE, QUEUED=QUEUED, INFLIGHT=INFLIGHT)

_TAKE_SQL = """
UPDATE jobs_partition p SET owner = %(worker)s, lease_until = now() + %(lease)s * interval '1 second',
       version = p.version + 1
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS v(id, version)
 WHERE p.id = v.id AND p.version = v.version AND p.status = {AVAILABLE}
RETURNING p.id, p.version
""".format(AVAILABLE=AVAILABLE)

_STEAL_CANDIDATE_SQL = """
SELECT p.id, p.version FROM jobs_partition p
 WHERE p.owner = %(victim)s AND p.lease_until > now() AND p.status = {AVAILABLE}
   AND NOT EXISTS (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                      AND j.status = {INFLIGHT})
 ORDER BY random() LIMIT 1
""".format(AVAILABLE=AVAILABLE, INFLIGHT=INFLIGHT)


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
    from jobs.state import PUSH_CLAIM_LOCK

    lease = lease_seconds() if lease is None else float(lease)
    out = LeaseCycle()
    params = {"worker": worker, "lease": lease, "renew_before": lease * 2.0 / 3.0}

    def plan(cur):
        cur.execute(_OWNERS_SQL)
        owners = dict(cur.fetchall())
        cur.execute(_FREE_SQL, {"limit": candidates})
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
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [PUSH_CLAIM_LOCK])
        cur.execute(_RENEW_SQL, params)
        out.writes += cur.fetchall()
        out.renewed = len(out.writes)
        cur.execute(_RELEASE_IDLE_SQL, params)
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
            cur.execute(_TAKE_SQL, {**params, "ids": [p[0] for p in pick], "versions": [p[1] for p in pick]})
            taken = cur.fetchall()
            out.writes += taken
            out.taken = len(taken)
            mine += out.taken
        if mine < fair and victims:
            cur.execute(_STEAL_CANDIDATE_SQL, {"victim": victims[0][1]})
            cand = cur.fetchone()
            if cand is not None:
                cur.execute(_TAKE_SQL, {**params, "ids": [cand[0]], "versions": [cand[1]]})
                stolen = cur.fetchall()
                out.writes += stolen
                out.stolen = len(stolen)
                mine += out.stolen
        out.owned = mine
    return out


def partition_leases_release(*, worker: str) -> int:
    """Give back every lease of ``worker`` (clean shutdown). Returns how many."""
    with connection.cursor() as cur:
        cur.execute(_RELEASE_ALL_SQL, {"worker": worker})
        return cur.rowcount
