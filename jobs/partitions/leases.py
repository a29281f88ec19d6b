"""Push workers' leases on partitions, like a change-feed processor: each worker takes free or
expired partitions up to its fair share, then steals at most one per cycle from the most loaded
owner above the fair share. A lease is only taken while none of the partition's jobs is in flight,
under the push claim lock (``push_claims_serialize``), so a job is never delivered by one worker
while another holds its partition's lease."""

from __future__ import annotations

import logging
import math
import os
import random
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.db.run import query_fetchall
from jobs.partitions.queries import Q

PUSH_CLAIM_LOCK = 0x70757368  # pg_advisory_xact_lock key serializing push claims ("push")


def push_claims_serialize(cur, *, prepare: bool | None = None) -> None:
    """Take the push claim lock for the rest of the transaction: push claims (jobs.push.claim) and
    lease grabs run one at a time database-wide, so a fresh snapshot sees every earlier one."""
    if prepare is None:
        cur.execute(Q.push_claim_lock.sql, [PUSH_CLAIM_LOCK])
    else:
        cur.execute(Q.push_claim_lock.sql, [PUSH_CLAIM_LOCK], prepare=prepare)


logger = logging.getLogger(__name__)


def lease_seconds() -> float:
    """``BROKER_PARTITION_LEASE_SECONDS`` (default 10): a push worker's lease on a partition;
    renewed when a third of it has passed."""
    value = getattr(settings, "BROKER_PARTITION_LEASE_SECONDS", None)
    if value is None:
        value = os.environ.get("BROKER_PARTITION_LEASE_SECONDS") or 10.0
    return max(0.3, float(value))


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

    Takes the push claim lock (PUSH_CLAIM_LOCK) only when there is something to take,
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
            push_claims_serialize(cur)
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
