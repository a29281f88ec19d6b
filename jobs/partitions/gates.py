"""Handler-driven gate moves of partitioned jobs: INFLIGHT -> QUEUED at a higher gate of the job's
partition (``gate_move``): the status writer the pull ack and the push record both call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from broker.db.run import query_fetchall
from jobs.state import floors
from jobs.partitions.queries import Q
from jobs.partitions.settle import settle_on_commit
from jobs.state.transitions import INFLIGHT, QUEUED, transition_check


@dataclass
class GateMove:
    """A partitioned job's handler said "not done, continue at ``gate``" (> its current gate),
    optionally with a new payload for this job only (``payload`` None keeps the current one)."""

    job_id: int
    gate: int
    payload: bytes | None = None


def jobs_move_gate(*, moves: Sequence[GateMove], consumer_pk: int | None = None) -> dict[int, int]:
    """INFLIGHT -> QUEUED at a higher gate of the job's partition (history reason ``gate``; retry
    count reset: it is the next step, not a retry), due at once. One statement; guarded by
    INFLIGHT, a partition and a greater gate. Returns {job_id: partition_id} of the jobs moved;
    their partitions are settled after commit (the old gate may be finished now)."""
    transition_check(INFLIGHT, QUEUED, "gate")
    if not moves:
        return {}
    rows = query_fetchall(Q.gate_move, {
        "ids": [m.job_id for m in moves], "gates": [int(m.gate) for m in moves],
        "payloads": [m.payload for m in moves], "keep": [m.payload is None for m in moves],
        "consumer": consumer_pk,
    })
    settle_on_commit(r[1] for r in rows)
    for consumer in {r[3] for r in rows}:  # back to QUEUED below the floors of this process's walks
        floors.consumer_reset(consumer)
    return {r[0]: r[1] for r in rows}
