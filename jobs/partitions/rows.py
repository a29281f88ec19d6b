"""A partition as it is read: its row (by pk or by consumer and key), its jobs counted per gate and
status, the JSON shape the API and the admin show; and the partitions a publish needs (created
on first use)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from broker.db.run import query_fetchall, query_fetchone
from broker.errors import Conflict, NotFound
from jobs.models import PartitionStatus
from jobs.partitions.queries import Q
from jobs.state.transitions import STATUS_NAMES, STATUSES

logger = logging.getLogger(__name__)
AVAILABLE, FAILED, COMPLETE = (PartitionStatus.AVAILABLE.value, PartitionStatus.FAILED.value,
                               PartitionStatus.COMPLETE.value)
PARTITION_STATUS_NAMES = {AVAILABLE: "AVAILABLE", FAILED: "FAILED", COMPLETE: "COMPLETE"}
KEY_MAX = 255
OCC_RETRIES = 50  # re-reads of a partition row whose version changed under a write, before giving up


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


def partition_row_read(*, partition_pk: int | None = None, consumer_pk: int | None = None,
                       key: str | None = None) -> Row | None:
    """A partition by primary key, or by (consumer, key); None when there is none."""
    r = query_fetchone(Q.partition_row, {"id": partition_pk, "consumer": consumer_pk, "key": key})
    return Row(*r[:15], leased=bool(r[15]), completed_at=r[16]) if r else None


def partition_require(partition_pk=None, consumer_pk=None, key=None) -> Row:
    row = partition_row_read(partition_pk=partition_pk, consumer_pk=consumer_pk, key=key)
    if row is None:
        raise NotFound("partition_not_found", "partition not found")
    return row


def partition_counts_read(partition_pk: int, from_gate: int = 0) -> dict[tuple[int, int], int]:
    """{(gate, status): n} of the partition's jobs at ``from_gate`` or above (the partial index
    ``job_partition_gate``: a bounded scan of one partition, never of the job table)."""
    return {(g, s): n for g, s, n in query_fetchall(Q.partition_counts, [partition_pk, from_gate])}


def counts_repr(counts: dict[tuple[int, int], int]) -> dict:
    """{"<gate>": {"QUEUED": n, ...}} for the API and advisories, plus totals."""
    per_gate: dict[str, dict] = {}
    totals = {STATUS_NAMES[status]: 0 for status in STATUSES}
    for (gate, status), n in sorted(counts.items()):
        name = STATUS_NAMES.get(status, str(status))
        per_gate.setdefault(str(gate), {})[name] = n
        totals[name] = totals.get(name, 0) + n
    return {"gates": per_gate, "total": totals}


def partition_repr(row: Row, *, counts: bool = True) -> dict:
    def ts(v):
        return v.isoformat().replace("+00:00", "Z") if v is not None else None

    body = {
        "key": row.key, "consumer": row.consumer_id, "channel": row.channel_id, "gate": row.gate,
        "status": PARTITION_STATUS_NAMES.get(row.status, str(row.status)), "closed": row.closed,
        "autoClose": row.auto_close, "manualCheckpoint": row.manual_checkpoint,
        "owner": row.owner or None, "leaseUntil": ts(row.lease_until) if row.owner else None,
        "leased": bool(row.owner) and row.leased, "version": row.version,
        "createdAt": ts(row.created_at), "updatedAt": ts(row.updated_at), "completedAt": ts(row.completed_at),
    }
    if counts:
        c = counts_repr(partition_counts_read(row.id))
        body["counts"] = c["gates"]
        body["totals"] = c["total"]
    return body


def partition_get(*, consumer_pk: int | None = None, key: str | None = None,
                  partition_pk: int | None = None) -> dict:
    """A partition with its counts per gate and status (NotFound for an unknown one)."""
    return partition_repr(partition_require(partition_pk, consumer_pk, key))


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
