"""Priority groups of pull consumers (ADR-42): overflow, pinned_client, prioritized, unpin.

Only consumers with a policy come here; the plain pull path (``jobs.pull.claim.jobs_pull``) is
untouched. Everything every web process must agree on lives in the database:

- each waiting pull is a ``PullWaiter`` row (group, priority, pin id, thresholds, batch);
- the pin of a group is a ``PriorityGroupState`` row (pin id, pin time, last renewal);
- who gets a job is decided by ``_dispatch`` under ``pg_advisory_xact_lock`` on the consumer:
  it claims jobs through ``jobs.pull.claim`` and appends their ids to the chosen waiter's row, then
  NOTIFYs; each waiter (in whatever process) wakes, reads its row and answers.

A waiter collects jobs until its batch is full or its ``expires`` runs out (so round-robin and
priority take-over can be seen by buffered HTTP answers), sleeps without a database connection,
and a waiter that dies leaves a row that simply expires (its claimed jobs time out as usual).
The pin timer is reset by a pull carrying the current pin id, never by deliveries; a pin past
``priorityTimeout`` is released by whichever process next looks (a dispatch, a waiting standby
that woke for the pin's expiry, GET consumer).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from django.db import connection, transaction

from broker.counters import JOB, counts_for
from broker.errors import InvalidInput, Locked, NotFound
from consumers.priority import DEFAULT_PIN_TIMEOUT, GROUP_NAME, NONE, OVERFLOW, PINNED, PRIORITIZED
from jobs.advisories.record import advisory_record
from jobs.partitions.settle import pull_waiters_wake
from jobs.pull.claim import (WAIT_SAFETY_NET, WAIT_UNLISTENED, ClaimedJob, claimed_jobs, jobs_claim,
                             pull_wait_begin)
from jobs.pull.next import pull_next_in
from jobs.pull.queries import Q
from jobs.pull.wakeups import connection_parked, wakeups
from jobs.state.transitions import INFLIGHT, QUEUED
from jobs.sweeps.inflight_timeout import consumer_sweep

LOCK_BASE = 0x7072 << 48  # pg_advisory_xact_lock key: "pr" + consumer pk (distinct from other locks)
WAITING, SERVED, WRONG_PIN = 0, 1, 2
PINNED_ADVISORY = "consumer_group_pinned"
UNPINNED_ADVISORY = "consumer_group_unpinned"


def _lock(cur, consumer_pk: int) -> None:
    """Serialize every decision about this consumer's waiters and pins, across all processes."""
    cur.execute(Q.group_lock.sql, [LOCK_BASE + int(consumer_pk)])


@dataclass
class GroupState:
    group: str
    pin: str = ""
    pinned_ts: object = None
    expires_in: float | None = None  # seconds until the pin times out (None: no pin)


@dataclass
class Target:
    """The consumer a group decision is about (from a pull's auth row or a Consumer)."""

    consumer_pk: int
    channel_id: str
    consumer_id: str
    policy: str
    groups: list
    timeout: float | None


def target_for(consumer) -> Target:
    return Target(consumer_pk=consumer.pk, channel_id=consumer.channel.channel_id, consumer_id=consumer.consumer_id,
                  policy=consumer.priority_policy, groups=list(consumer.priority_groups or []),
                  timeout=consumer.priority_timeout)


def _group_state(cur, target: Target, group: str) -> GroupState:
    """The group's pin, released first if its timer ran out (UNPINNED, reason timeout)."""
    cur.execute(Q.group_state_ensure.sql, [target.consumer_pk, group])
    cur.execute(Q.group_state_read.sql, [target.timeout or DEFAULT_PIN_TIMEOUT, target.consumer_pk, group])
    pin, pinned_ts, expires_in = cur.fetchone()
    gs = GroupState(group=group, pin=pin or "", pinned_ts=pinned_ts,
                    expires_in=float(expires_in) if pin and expires_in is not None else None)
    if gs.pin and target.policy == PINNED and gs.expires_in is not None and gs.expires_in <= 0:
        _unpin(cur, target, gs, reason="timeout")
    return gs


def _unpin(cur, target: Target, gs: GroupState, *, reason: str) -> None:
    cur.execute(Q.group_unpin.sql, [target.consumer_pk, gs.group])
    advisory_record(type=UNPINNED_ADVISORY, channel=target.channel_id, consumer=target.consumer_id,
                    consumer_pk=target.consumer_pk, group=gs.group, data={"reason": reason})
    gs.pin, gs.pinned_ts, gs.expires_in = "", None, None
    pull_waiters_wake(consumer_pk=target.consumer_pk)  # waiting standbys re-run the dispatch: a new pin can be picked


def _pin(cur, target: Target, gs: GroupState, pin: str) -> None:
    cur.execute(Q.group_pin.sql, [pin, target.consumer_pk, gs.group])
    gs.pin, gs.pinned_ts, gs.expires_in = pin, cur.fetchone()[0], target.timeout or DEFAULT_PIN_TIMEOUT
    advisory_record(type=PINNED_ADVISORY, channel=target.channel_id, consumer=target.consumer_id,
                    consumer_pk=target.consumer_pk, group=gs.group, data={"pinned_id": pin})


def groups_state(*, target: Target) -> list[dict]:
    """``PriorityGroups`` of GET consumer: the pin id and time only while pinned (an expired pin
    is released on the way)."""
    if target.policy == NONE or not target.groups:
        return []
    result = []
    with transaction.atomic(), connection.cursor() as cur:
        _lock(cur, target.consumer_pk)
        for group in target.groups:
            gs = _group_state(cur, target, group)
            item = {"group": group}
            if gs.pin:
                item["pinned_client_id"] = gs.pin
                item["pinned_ts"] = gs.pinned_ts.isoformat().replace("+00:00", "Z")
            result.append(item)
    return result


def group_unpin(*, target: Target, group, reason: str = "admin") -> dict:
    """Release a group's pin (UNPINNED advisory with ``reason``); the next job pins another
    waiting pull. The API, the admin action and the ``unpin`` command all come here."""
    if not isinstance(group, str) or group == "":
        raise InvalidInput("group_missing", "consumer group not specified")
    if not GROUP_NAME.match(group):
        raise InvalidInput("invalid_group_name",
                           "valid priority group name must match A-Z, a-z, 0-9, -_/= and may not exceed 16 characters")
    if target.policy == NONE or group not in target.groups:
        raise NotFound("group_not_found", "provided priority group does not exist for this consumer")
    with transaction.atomic(), connection.cursor() as cur:
        _lock(cur, target.consumer_pk)
        gs = _group_state(cur, target, group)
        previous = gs.pin
        if previous:
            _unpin(cur, target, gs, reason=reason)
    return {"Group": group, "Unpinned": bool(previous), "PreviousPinId": previous or None}


@dataclass
class Waiter:
    id: int
    pin_id: str
    priority: int
    min_pending: int | None
    min_ack_pending: int | None
    batch: int
    max_bytes: int | None
    incremental_timeout: float | None
    have: int
    turn: int
    done: bool = False

    @property
    def want(self) -> int:
        return 0 if self.done else self.batch - self.have


@dataclass
class Dispatch:
    target: Target
    cur: object
    gs: GroupState
    changed: bool = False
    max_turn: int = 0

    def give(self, w: Waiter, n: int, *, pin: str | None = None) -> int:
        """Claim up to ``n`` jobs (jobs.pull.claim, SKIP LOCKED) and hand them to waiter ``w``."""
        if n <= 0:
            return 0
        # a byte budget (max_bytes) is spent by one claim: at least one job, then what fits
        jobs = jobs_claim(consumer_pk=self.target.consumer_pk, limit=n, max_bytes=w.max_bytes,
                          incremental_timeout=w.incremental_timeout, reason="pull-group")
        if not jobs:
            return 0
        if pin is not None:
            w.pin_id = pin
        w.have += len(jobs)
        w.done = w.have >= w.batch or w.max_bytes is not None
        self.max_turn += 1
        w.turn = self.max_turn
        self.cur.execute(Q.group_waiter_serve.sql,
                         [[j.id for j in jobs], SERVED if w.done else WAITING, w.pin_id, w.turn, w.id])
        self.changed = True
        return len(jobs)

    def wrong_pin(self, w: Waiter) -> None:
        w.done = True
        self.cur.execute(Q.group_waiter_wrong_pin.sql, [WRONG_PIN, w.id])
        self.changed = True


def _dispatch(cur, target: Target, group: str) -> GroupState:
    """Hand due jobs to waiting pulls by the consumer's policy. Called under ``_lock``. Each
    waiter is considered a bounded number of times (every hand-out claims at least one job or
    ends the loop), so ineligible waiters never make it spin."""
    gs = _group_state(cur, target, group)
    cur.execute(Q.group_waiters.sql, [target.consumer_pk])
    waiters = sorted((Waiter(*row) for row in cur.fetchall()), key=lambda w: w.id)
    if not waiters:
        return gs
    d = Dispatch(target=target, cur=cur, gs=gs, max_turn=max(w.turn for w in waiters))
    if target.policy == PINNED:
        cur.execute(Q.group_due.sql, [target.consumer_pk, target.consumer_pk])
        if not cur.fetchone()[0]:
            return gs
        for w in waiters:  # an id that is not the current pin is stale: 423 when a job is dispatched
            if w.pin_id and w.pin_id != gs.pin:
                d.wrong_pin(w)
        if not gs.pin:
            for w in waiters:
                if not w.done:  # the oldest standby becomes the pin, on actual delivery only
                    pin = secrets.token_hex(11)
                    if d.give(w, w.want, pin=pin):
                        _pin(cur, target, gs, pin)
                    break
        else:
            for w in waiters:
                if not w.done and w.pin_id == gs.pin:
                    if not d.give(w, w.want):
                        break
    elif target.policy == OVERFLOW:
        counts = counts_for(scope=JOB, owner_ids=[target.consumer_pk]).get(target.consumer_pk, {})
        pending, ack_pending = counts.get(QUEUED, 0), counts.get(INFLIGHT, 0)
        progress = True
        while progress:
            progress = False
            for w in waiters:
                if not w.want:
                    continue
                if not w.min_pending and not w.min_ack_pending:
                    allowed = w.want
                elif w.min_ack_pending and ack_pending >= w.min_ack_pending:
                    allowed = w.want  # handing out jobs only raises NumAckPending
                elif w.min_pending and pending >= w.min_pending:
                    allowed = min(w.want, pending - w.min_pending + 1)
                else:
                    continue  # not eligible now: skipped, never blocks the waiters behind it
                n = d.give(w, allowed)
                if not n:
                    progress = False
                    break
                pending -= n
                ack_pending += n
                progress = True
    elif target.policy == PRIORITIZED:
        while True:
            wanting = [w for w in waiters if w.want]
            if not wanting:
                break
            level = min(w.priority for w in wanting)
            peers = sorted((w for w in wanting if w.priority == level), key=lambda w: (w.turn, w.id))
            w = peers[0]  # lowest number first; round-robin (least recently served) within a level
            if not d.give(w, w.want if len(peers) == 1 else 1):
                break
    if d.changed:
        pull_waiters_wake(consumer_pk=target.consumer_pk)
    return gs


@dataclass
class GroupPull:
    jobs: list = field(default_factory=list)
    pin_id: str = ""
    wrong_pin: bool = False


def _jobs(cur, ids) -> list[ClaimedJob]:
    if not ids:
        return []
    cur.execute(Q.group_jobs.sql, [list(ids), INFLIGHT])
    return claimed_jobs(cur.fetchall())


def _finish(cur, waiter_id: int) -> GroupPull:
    """Remove the waiter (under the lock, so no dispatch hands it a job it would never answer)."""
    cur.execute(Q.group_waiter_finish.sql, [waiter_id])
    row = cur.fetchone()
    if row is None:
        return GroupPull()
    ids, st, pin = row
    return GroupPull(jobs=_jobs(cur, ids), pin_id=pin or "", wrong_pin=st == WRONG_PIN)


def jobs_pull_grouped(*, ctx, req) -> GroupPull:
    """A pull on a consumer with a priority policy (fields already checked by
    ``jobs.pull.claim.pull_request_check``). Admission, pin check and timer reset, waiter insert
    and a first dispatch are one transaction under the consumer's lock; then the waiter sleeps
    (no connection held) until its row is served, its expiry, or the pin's timeout."""
    target = Target(consumer_pk=ctx.consumer_pk, channel_id=ctx.channel_id, consumer_id=ctx.consumer_id,
                    policy=ctx.policy, groups=ctx.groups, timeout=ctx.priority_timeout)
    wait, end, mark = pull_wait_begin(ctx=ctx, req=req)
    mismatch = False
    with transaction.atomic(), connection.cursor() as cur:
        _lock(cur, ctx.consumer_pk)
        gs = _group_state(cur, target, req.group)
        if target.policy == PINNED and req.pin_id and gs.pin:
            if req.pin_id != gs.pin:
                mismatch = True  # answered after commit: a timeout release above must stay recorded
            else:  # the pinned client is alive: reset the pin timer
                cur.execute(Q.group_pin_renew.sql, [ctx.consumer_pk, req.group])
                gs.expires_in = target.timeout or DEFAULT_PIN_TIMEOUT
        if not mismatch:
            cur.execute(Q.group_waiter_insert.sql, {
                "consumer": ctx.consumer_pk, "group": req.group, "priority": req.priority, "pin": req.pin_id,
                "min_pending": req.min_pending or None, "min_ack_pending": req.min_ack_pending or None,
                "batch": req.batch, "max_bytes": req.max_bytes, "inc": req.incremental_timeout,
                "expires": max(req.expires, 1.0) if wait else 60.0,
            })
            waiter_id = cur.fetchone()[0]
            gs = _dispatch(cur, target, req.group)
            if not wait:
                return _finish(cur, waiter_id)
            cur.execute(Q.group_waiter_state.sql, [waiter_id])
            if cur.fetchone()[0] != WAITING:
                return _finish(cur, waiter_id)
            due_in, deadline_in = pull_next_in(consumer_pk=ctx.consumer_pk)
    if mismatch:
        raise Locked("pin_id_mismatch", "Nats-Pin-Id mismatch")
    try:
        while True:
            now = time.monotonic()
            remaining = end - now
            if remaining <= 0:
                break
            sleep = min(remaining, WAIT_SAFETY_NET if wakeups.connected.is_set() else WAIT_UNLISTENED)
            for value in (due_in, deadline_in, gs.expires_in):
                if value is not None:
                    sleep = min(sleep, max(float(value), 0.0) + 0.05)
            sleep = max(sleep, 0.01)
            deadline_at = now + float(deadline_in) if deadline_in is not None else None
            with connection_parked():  # never a transaction, and few connections, while sleeping
                wakeups.wait(ctx.consumer_pk, mark, sleep)
            mark = wakeups.mark(ctx.consumer_pk)
            consumer_sweep(consumer_pk=ctx.consumer_pk,
                           force=deadline_at is not None and time.monotonic() >= deadline_at)
            with transaction.atomic(), connection.cursor() as cur:
                _lock(cur, ctx.consumer_pk)
                gs = _dispatch(cur, target, req.group)
                cur.execute(Q.group_waiter_state.sql, [waiter_id])
                row = cur.fetchone()
                if row is None or row[0] != WAITING:
                    return _finish(cur, waiter_id)
                due_in, deadline_in = pull_next_in(consumer_pk=ctx.consumer_pk)
    except BaseException:
        with transaction.atomic(), connection.cursor() as cur:
            _lock(cur, ctx.consumer_pk)
            _finish(cur, waiter_id)
        raise
    with transaction.atomic(), connection.cursor() as cur:
        _lock(cur, ctx.consumer_pk)
        return _finish(cur, waiter_id)
