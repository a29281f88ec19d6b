"""The push dispatcher: claim due jobs, POST them, record the outcomes in batches.

One loop runs per django-q2 worker that holds a dispatcher slot (``jobs.tasks.push_dispatch``).
Two threads per process: this coordinator (all database work) and the HTTP client's event loop
(``jobs.callbacks.http``: every callback in flight, no thread per callback).

    wait (select) for a NOTIFY on this loop's own LISTEN connection, a finished callback (wake
    pipe), a retry or pacing timer, or the safety-net poll
    -> one transaction: record the finished attempts (``jobs_push_record``, one statement), then
       claim as many due jobs as there is room for (``jobs_claim_push``); under load at most one
       such transaction per ``BROKER_PUSH_WINDOW`` (what arrives meanwhile waits for the next)
    -> hand the claimed jobs to the event loop
    -> housekeeping (jobs.housekeeping), each step at its period: every second the in-flight
       timeout sweep, due scheduled messages and lost partition settles; every 5 s the counter
       compaction; every minute the doorbell prune.

Recording and claiming share a transaction so the room freed by finished callbacks is
visible to the claim at once: with maxInFlight = 10 a consumer's throughput is 10 / (callback
round trip + one transaction), not 10 / (round trip + two transactions + a poll). The window is
what one message costs the database: each transaction pays its statements' fixed costs (the
triggers' history and counter rows) once for the whole batch; after a quiet spell the first claim
runs at once, so a single message is never held, and successful attempts of a *saturated* consumer
(its last claim took all of its room: more jobs wait for room) are recorded at once, so a
consumer held back by its maxInFlight gets its room back without waiting for the window.
Everything is at-least-once: a job whose outcome cannot be recorded stays INFLIGHT until its deadline and
the sweep queues it again.

Good neighbours (issue 35): each claim holds every consumer to its fair share of this loop's
callbacks (``jobs.push.claim.fair_caps``, from ``inflight``: callbacks in flight here per
consumer), the HTTP client opens new connections to one endpoint at ``BROKER_PUSH_CONNECT_RATE``, a
NOTIFY naming only consumers that wait for room with callbacks still here does not wake the loop
(``_blocked``), and a failed attempt never cuts the window short.
"""

from __future__ import annotations

import heapq
import logging
import os
import select
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.db.errors import DB_ERRORS, DB_RETRY, database_unavailable
from broker.db.listen import Listener
from broker.db.run import bound_cursor
from broker.xid import job_xid
from jobs.callbacks.http import Client as HttpClient
from jobs.callbacks.target import Target
from jobs.housekeeping import Housekeeping
from jobs.partitions.leases import lease_seconds, partition_leases_cycle, partition_leases_release
from jobs.publish.wakeup import CHANNEL
from jobs.push.claim import (PUSH_TRANSACTION_SETUP, fair_caps, fair_share, jobs_claim_push, saturation_update,
                             window_hold)
from jobs.push.delivery import attempt_deliver, targets_load
from jobs.push.lag import DeliveryLag
from jobs.push.owners import owner_id_new, push_owner_lag_report, push_owner_register
from jobs.push.queries import Q
from jobs.push.record import outcomes_record

logger = logging.getLogger(__name__)
LEASE_KICK = 0.2  # seconds: the soonest a NOTIFY brings the next partition lease cycle after the last
LEASE_KICK_UNUSED = 1.0  # ... when the last cycle found no partition with work (none owned, none free)
IDLE_AFTER = 10.0  # seconds without a claimed or recorded job: the loop is idle (see BROKER_PUSH_IDLE_POLL)


@dataclass
class _Loop:
    """The state of one ``Engine.run``, shared by its steps (created when the run starts)."""

    start: float
    claim_until: float
    drain_until: float
    drain_for: float
    stop: threading.Event | None
    housekeeping: bool
    batch: int
    poll: float
    events: list  # [(monotonic time, callable)], soonest first
    next_poll: float
    chores: Housekeeping
    lease_every: float
    next_lease: float
    idle_poll: float = 5.0  # the safety-net poll and lease cycle of an idle loop (BROKER_PUSH_IDLE_POLL)
    busy_at: float = 0.0  # monotonic time of the last transaction that claimed or recorded a job
    last_lease: float = float("-inf")  # monotonic time of the last lease cycle
    # monotonic times when our own retries / paced consumers are due
    timers: list[float] = field(default_factory=list)
    stats: dict = field(default_factory=lambda: {
        "claimed": 0, "recorded": 0, "transactions": 0, "errors": 0, "db_seconds": 0.0})
    claiming: bool = True
    kicked: bool = True
    notified: bool = False  # the last wait ended on a NOTIFY (worth a partition lease cycle soon)
    window: float = 0.0  # seconds between two transactions (BROKER_PUSH_WINDOW)
    last_tx: float = float("-inf")  # monotonic start of the last record-and-claim transaction
    # finished attempts not yet recorded (kept across a DB error)
    pending: list[tuple] = field(default_factory=list)
    down_since: float | None = None  # monotonic time of the first database error of an outage

    @classmethod
    def begin(cls, *, claim_for: float, drain_for: float, stop: threading.Event | None, events: list | None,
              housekeeping: bool) -> _Loop:
        """The deadlines and settings of a run starting now; claim, poll and lease cycle at once."""
        start = time.monotonic()
        claim_until = start + claim_for
        return cls(start=start, claim_until=claim_until, drain_until=claim_until + drain_for, drain_for=drain_for,
                   stop=stop, housekeeping=housekeeping, batch=max(1, int(settings.BROKER_PUSH_BATCH)),
                   poll=max(0.05, float(settings.BROKER_PUSH_POLL)),
                   events=sorted(((start + at, fn) for at, fn in (events or [])), key=lambda e: e[0]),
                   next_poll=start, chores=Housekeeping(start=start), window=max(0.0, float(settings.BROKER_PUSH_WINDOW)),
                   lease_every=min(1.0, lease_seconds() / 3.0), next_lease=start, busy_at=start,
                   idle_poll=max(float(settings.BROKER_PUSH_POLL), float(settings.BROKER_PUSH_IDLE_POLL)))

    def idle(self, now: float) -> bool:
        """Nothing claimed or recorded for a while: the safety-net poll and an empty lease cycle slow
        down to ``idle_poll`` (a NOTIFY still wakes the loop at once)."""
        return now - self.busy_at >= IDLE_AFTER

    def result(self) -> dict:
        """The counters for the log, with the run's length."""
        self.stats["seconds"] = round(time.monotonic() - self.start, 1)
        self.stats["db_seconds"] = round(self.stats["db_seconds"], 2)
        return self.stats


class Engine:
    """Per-process delivery machinery, reused by successive loop tasks in one worker process:
    the HTTP client's event loop thread, the consumer cache and the finished-attempt queue."""

    def __init__(self, concurrency: int | None = None) -> None:
        self.size = max(1, int(concurrency or settings.BROKER_PUSH_CONCURRENCY))
        self.client = HttpClient(connect_rate=float(settings.BROKER_PUSH_CONNECT_RATE or 0) or None)
        self.done: deque = deque()
        self.inflight: dict[int, int] = {}  # consumer pk: its callbacks in flight here (coordinator thread only)
        self.targets: dict[int, Target] = {}
        self.pull_pks: set[int] = set()
        self.saturated: set[int] = set()  # consumers whose last claim took all of their room
        self.lag = DeliveryLag()  # how far behind this engine's deliveries are (publishing's admission reads it)
        self._pull_loaded = 0.0
        self._running = 0  # handed to the client, outcome not yet collected (coordinator thread only)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._signalled = False
        # This loop's own LISTEN connection, waited on with select() together with the wake pipe, so
        # a publish reaches the claim with no thread hand-off (jobs.pull.wakeups's shared listener wakes
        # waiters through two threads). Reconnects quietly; the poll covers the gap.
        # Its backend is also this engine's owner row (jobs.push.owners): when the process goes,
        # however it goes, its claims go back to the queue at the next housekeeping run anywhere.
        self.owner_id = owner_id_new()
        self.listener = Listener([CHANNEL], application_name="broker-push-listen", on_connect=self._listener_connected)
        self.wake_share: tuple[int, int] | None = None  # (slot, slots): see _worth_claiming
        # jobs.partitions: this engine's lease owner id; partitions are claimed only while leased
        self.worker_id = uuid.uuid4().hex
        self.lease_stats = None
        self.stats: dict = {}

    def _listener_connected(self, conn) -> None:
        """Register this engine's owner row on the new backend, then LISTEN once more so the session's
        last statement says what it is for (pg_stat_activity.query: operators and the chaos test
        find the listeners by it)."""
        push_owner_register(conn=conn, owner_id=self.owner_id)
        self.listener.listen(*self.listener.channels)

    # --- the HTTP side (event loop thread) ---------------------------------------------------
    async def _deliver(self, item) -> None:
        job, target = item
        result = await attempt_deliver(self.client, job, target, worker=self.worker_id)
        self.done.append((job, target, result))
        if not self._signalled:  # one byte per batch of finished attempts
            self._signalled = True
            os.write(self._wake_w, b"x")

    def idle_capacity(self) -> int:
        return max(0, self.size - self._running)

    @property
    def running(self) -> int:
        return self._running

    def close(self) -> None:
        self.client.stop()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- the loop (coordinator thread) ---------------------------------------------------------
    def _collect(self) -> list[tuple]:
        self._signalled = False
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        items = []
        inflight = self.inflight
        while self.done:
            item = self.done.popleft()
            items.append(item)
            pk = item[0].consumer_pk
            left = inflight.get(pk, 0) - 1
            if left > 0:
                inflight[pk] = left
            else:
                inflight.pop(pk, None)
        self._running -= len(items)
        return items

    def _wait(self, timeout: float):
        """Sleep until a NOTIFY worth a claim, a finished attempt or ``timeout``. Returns "notify",
        "outcome" (finished attempts only: their room may be reusable at once) or False."""
        poller = select.poll()  # not select(): this process may hold more than 1024 sockets
        poller.register(self._wake_r, select.POLLIN)
        listen_fd = self.listener.fileno()
        if listen_fd is not None:
            poller.register(listen_fd, select.POLLIN)
        try:
            ready = {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000.0)}
        except OSError as exc:
            self.listener.lost(exc)
            return "notify"
        if listen_fd is not None and listen_fd in ready and self._worth_claiming(self.listener.drain()):
            return "notify"
        return "outcome" if self._wake_r in ready else False

    def _worth_claiming(self, notified) -> bool:
        """Whether a NOTIFY calls for a claim by this loop: not when every notified consumer is a
        pull consumer (their jobs are never pushed), nor when the notified consumers are another
        loop's share (``wake_share``: with several loops, one claim per publish is enough; every
        claim still covers all consumers, and the poll stays as the safety net)."""
        if notified is None:
            return True
        if time.monotonic() - self._pull_loaded > 5.0:
            try:
                with connection.cursor() as cur:
                    cur.execute(Q.pull_consumer_ids.sql)
                    self.pull_pks = {row[0] for row in cur.fetchall()}
            except DB_ERRORS:
                connection.close()
                return True  # the claim finds out whether the database is back
            self._pull_loaded = time.monotonic()
        share = self.wake_share
        return any(pk not in self.pull_pks and (share is None or pk % share[1] == share[0]) and not self._blocked(pk)
                   for pk in notified)

    def _blocked(self, pk: int) -> bool:
        """Whether a claim by this loop could give consumer ``pk`` nothing new, so a NOTIFY of its
        jobs need not wake the loop: its callbacks in flight here fill its fair share, or its last
        claim took all of its room and some of those callbacks are still here (their outcomes bring
        the claim that refills it). A consumer waiting at its maxInFlight costs no transaction."""
        n = self.inflight.get(pk, 0)
        return n > 0 and (pk in self.saturated or n >= fair_share(inflight=self.inflight, size=self.size))

    def _targets_refresh(self, jobs: list) -> None:
        """Load the consumers of ``jobs`` that are new or changed since cached (in the claim's
        transaction: if this fails, the claim is rolled back with it and no job is left in flight
        unsent)."""
        stale = {j.consumer_pk for j in jobs
                 if j.consumer_pk not in self.targets
                 or self.targets[j.consumer_pk].updated_at != j.consumer_updated_at}
        if stale:
            self.targets.update(targets_load(stale))

    def _submit(self, jobs: list) -> None:
        items = []
        inflight = self.inflight
        for job in jobs:
            target = self.targets.get(job.consumer_pk)
            if target is not None:  # else: consumer deleted since the claim, and its jobs with it
                items.append((job, target))
                inflight[job.consumer_pk] = inflight.get(job.consumer_pk, 0) + 1
        self._running += len(items)
        self.client.submit(items, self._deliver)

    def run(self, *, claim_for: float, drain_for: float = 30.0, stop: threading.Event | None = None,
            events: list | None = None, housekeeping: bool = True, wake_share: tuple[int, int] | None = None) -> dict:
        """Claim and deliver for ``claim_for`` seconds (or until ``stop`` is set), then stop claiming
        and wait up to ``drain_for`` seconds for the callbacks in flight, recording them.

        ``events``: [(seconds from start, callable)] run once from the loop (the task uses it to
        hand its slot over). ``wake_share``: (slot, slots) of this loop. Returns counters for the log.
        """
        self.wake_share = wake_share
        self.listener.fileno()  # LISTEN before the first claim, so no publish falls in between
        # one loop per cluster (slot 0, the first taken) runs the housekeeping steps: with several
        # loops each would repeat the same sweeps every second for nothing
        loop = _Loop.begin(claim_for=claim_for, drain_for=drain_for, stop=stop, events=events,
                           housekeeping=housekeeping and (wake_share is None or wake_share[0] == 0))
        self.stats = loop.stats  # the running loop's counters (tests and benchmarks read them as it runs)
        while True:
            now = time.monotonic()
            try:
                if self._step(loop, now):
                    break
            except DB_ERRORS as exc:  # a step the others do not guard: the loop goes on all the same
                self._db_failed(loop, exc)
            except Exception:  # noqa: BLE001 - a bug must not end delivery (nor the slot's hand-over)
                loop.stats["errors"] += 1
                logger.exception("push dispatcher: unexpected error; going on in 1 s")
                time.sleep(1.0)
            if not loop.claiming and time.monotonic() >= loop.drain_until:
                break
        self._leases_release()
        return loop.result()

    def _step(self, loop: _Loop, now: float) -> bool:
        """One turn of the loop (``run``); True when the loop is over."""
        self._events_run(loop, now)
        self._claiming_check(loop, now)
        self._timers_due(loop, now)
        finished = self._collect()
        if finished:
            loop.pending.extend(finished)
            # a saturated consumer's room is what it waits for: claim with the record. Other outcomes
            # are only recorded: new jobs come with their NOTIFY (to the loop whose share they are),
            # so two loops do not both claim after each other's callbacks, in twice the transactions.
            if not loop.kicked and any(job.consumer_pk in self.saturated for job, _, _ in finished):
                loop.kicked = True
        if not self._record_and_claim(loop, now):
            return False  # held for the window, or a database error: the finished attempts stay pending
        self._leases_due(loop, now)
        self._housekeeping_due(loop, now)
        if self._drained(loop, now):
            return True
        if loop.kicked and self.idle_capacity() > 0 and loop.claiming:
            return False  # kicked (full batch, new leases, timer, wake-up) with room: claim before sleeping
        self._sleep(loop)
        return False

    @staticmethod
    def _db_failed(loop: _Loop, exc: BaseException) -> None:
        """A database error (the server restarting, a cut connection, a failover, a bound passed):
        drop the connection (the next statement connects again, to whichever host is the primary
        now) and try again after ``DB_RETRY``. Logged once per outage, with its length when it ends;
        an error that is not an outage (a bug, a refused value) is logged with its traceback every time."""
        loop.stats["errors"] += 1
        connection.close()
        if not database_unavailable(exc):
            logger.exception("push dispatcher: database error; going on in %g s", DB_RETRY)
        elif loop.down_since is None:
            loop.down_since = time.monotonic()
            logger.warning("push dispatcher: database unavailable (%s: %s); retrying every %g s", type(exc).__name__,
                           (str(exc).strip().splitlines() or [""])[0], DB_RETRY)
        time.sleep(DB_RETRY)

    @staticmethod
    def _db_back(loop: _Loop) -> None:
        if loop.down_since is not None:
            logger.warning("push dispatcher: database back after %.1f s", time.monotonic() - loop.down_since)
            loop.down_since = None

    @staticmethod
    def _events_run(loop: _Loop, now: float) -> None:
        """The caller's one-off events that are due (the task hands its slot over this way); a
        failing event is logged, never the end of the loop."""
        while loop.events and loop.events[0][0] <= now:
            _, fn = loop.events.pop(0)
            try:
                fn()
            except Exception:  # noqa: BLE001
                logger.exception("push dispatcher event failed")

    @staticmethod
    def _claiming_check(loop: _Loop, now: float) -> None:
        """Stop claiming at ``claim_until`` or once ``stop`` is set; the drain then lasts at most
        ``drain_for`` from now, however early the stop came."""
        if loop.claiming and (now >= loop.claim_until or (loop.stop is not None and loop.stop.is_set())):
            loop.claiming = False
            loop.drain_until = min(loop.drain_until, now + loop.drain_for)

    @staticmethod
    def _timers_due(loop: _Loop, now: float) -> None:
        """A due retry or pacing timer means jobs may be claimable now: claim, without the
        coalescing delay."""
        while loop.timers and loop.timers[0] <= now:
            heapq.heappop(loop.timers)
            loop.kicked = True

    def _record_and_claim(self, loop: _Loop, now: float) -> bool:
        """Record the finished attempts and claim into the room there is, in one transaction so the
        room they freed is claimable at once; then schedule retries and hand the jobs over. False
        while held (the window since the last transaction is not over: the loop sleeps the rest of
        it, then starts over with what arrived meanwhile) and after a database error (the attempts
        stay pending, the loop starts over after ``DB_RETRY``)."""
        capacity = min(loop.batch, self.idle_capacity()) if loop.claiming else 0
        want_claim = capacity > 0 and (loop.kicked or now >= loop.next_poll)
        if not (loop.pending or want_claim):
            return True
        delivered: dict[int, int] = {}
        for job, _, result in loop.pending:
            if result.status_code is not None and 200 <= result.status_code < 300:
                delivered[job.consumer_pk] = delivered.get(job.consumer_pk, 0) + 1
        hold = window_hold(last=loop.last_tx, window=loop.window, now=now, saturated=self.saturated,
                           delivered=delivered, inflight=self.inflight)
        if hold > 0:
            time.sleep(hold)
            return False
        loop.last_tx = now
        db_start = time.perf_counter()
        try:
            retry_delays, jobs = self._transaction(loop.pending, now, capacity if want_claim else 0)
        except DB_ERRORS as exc:
            self._db_failed(loop, exc)
            if not database_unavailable(exc):
                self._pending_drop(loop)
            return False
        except Exception:  # noqa: BLE001 - a bug in recording must not stop claiming for the rest of the loop
            loop.stats["errors"] += 1
            logger.exception("push dispatcher: recording or claiming failed; going on in 1 s")
            self._pending_drop(loop)
            time.sleep(1.0)
            return False
        self._db_back(loop)
        loop.stats["transactions"] += 1
        loop.stats["db_seconds"] += time.perf_counter() - db_start
        loop.stats["recorded"] += len(loop.pending)
        for delay in retry_delays:
            self._timer(loop.timers, now + delay + 0.01)
        loop.pending = []
        if jobs or loop.pending:
            loop.busy_at = now
        if want_claim:
            loop.next_poll = now + (loop.idle_poll if loop.idle(now) else loop.poll)
            loop.kicked = len(jobs) >= capacity  # a full batch: more may be due right away
        if jobs:
            self._hand_over(loop, now, jobs)
        return True

    @staticmethod
    def _pending_drop(loop: _Loop) -> None:
        """Give up the finished attempts a failure that retrying would repeat (not an outage) keeps
        from being recorded, so the next turn claims again: their jobs stay INFLIGHT until their
        deadline, then go back to QUEUED and are delivered again (at-least-once; nothing is lost)."""
        if loop.pending:
            logger.error("push dispatcher: %d finished attempts not recorded; their jobs are redelivered after "
                         "their deadline: %s", len(loop.pending), [job_xid(p[0].id) for p in loop.pending[:20]])
            loop.pending = []

    def _transaction(self, pending: list[tuple], now: float, limit: int) -> tuple[list[float], list]:
        """One transaction: record ``pending``, then claim up to ``limit`` jobs (none when 0).
        Returns the retry delays of the recorded attempts and the claimed jobs."""
        retry_delays, jobs = [], []
        with transaction.atomic():
            with bound_cursor() as cur:
                cur.execute(PUSH_TRANSACTION_SETUP, prepare=True)  # generic plans, async commit
            if pending:
                retry_delays = outcomes_record(pending, now=now)
            if limit:
                jobs = jobs_claim_push(limit=limit, worker=self.worker_id, owner=self.owner_id,
                                       caps=fair_caps(inflight=self.inflight, size=self.size, limit=limit))
                self._targets_refresh(jobs)
                self.lag.observe(jobs, targets=self.targets, saturated=self.saturated, now=now)  # (before its update)
            figure = self.lag.due(now)
            if figure is not None:
                push_owner_lag_report(owner_id=self.owner_id, lag=figure)
                self.lag.written(figure)
        return retry_delays, jobs

    def _hand_over(self, loop: _Loop, now: float, jobs: list) -> None:
        """Give the claimed jobs to the event loop, and set a timer for each paced consumer among
        them: its next burst is allowed before the poll would come."""
        loop.stats["claimed"] += len(jobs)
        self._submit(jobs)
        saturation_update(self.saturated, jobs)
        for pk in {j.consumer_pk for j in jobs}:
            target = self.targets.get(pk)
            if target is not None and target.rate:
                # paced consumer: look again when its next burst is allowed
                self._timer(loop.timers, now + max(0.005, max(1.0, target.rate / 20.0) / target.rate))

    def _leases_due(self, loop: _Loop, now: float) -> None:
        """The partition lease cycle at its period; partitions newly taken are worth a claim now."""
        if now >= loop.next_lease:
            # Partition leases: from this coordinator thread, which never waits for callbacks
            # (they run on the HTTP client's event loop), so slow deliveries never delay renewal.
            loop.next_lease, loop.last_lease = now + loop.lease_every, now
            if self._lease_cycle(acquire=loop.claiming):
                loop.kicked = True
            elif self.lease_stats is not None and not self.lease_stats.owned and (
                    loop.idle(now) or (loop.claiming and not self.lease_stats.fair_share)):
                # no lease to renew, and the loop idle or (a claiming cycle saw) no partition in use
                # at all (none leased by anyone, none with work: only a publish makes one, and its
                # NOTIFY brings the next cycle): a new loop's busy first seconds need no cycle a second
                loop.next_lease = now + loop.idle_poll

    @staticmethod
    def _housekeeping_due(loop: _Loop, now: float) -> None:
        """The housekeeping steps that are due (jobs.housekeeping), unless the caller turned them off
        or the database is unavailable (the next successful claim says it is back)."""
        if loop.housekeeping and loop.down_since is None and now >= loop.chores.next_due():
            loop.chores.run_due(now)

    def _drained(self, loop: _Loop, now: float) -> bool:
        """Whether the loop is over: claiming has stopped and every callback is recorded, or the drain
        deadline has passed (the callbacks left are redelivered after their deadline)."""
        if not loop.claiming and (self._running == 0 or now >= loop.drain_until):
            if self._running:
                logger.warning("push dispatcher: %d callbacks still running at hand-over; their jobs "
                               "are redelivered after their deadline", self._running)
            return True
        return False

    def _sleep(self, loop: _Loop) -> None:
        """Wait until the next thing the loop has to do (poll or drain deadline, housekeeping, lease
        cycle, timer, event, end of claiming) or until woken by a NOTIFY or a finished attempt."""
        wait_until = min(loop.next_poll if loop.claiming else loop.drain_until,
                         loop.chores.next_due() if loop.housekeeping else loop.drain_until, loop.next_lease)
        if loop.timers:
            wait_until = min(wait_until, loop.timers[0])
        if loop.events:
            wait_until = min(wait_until, loop.events[0][0])
        if loop.claiming:
            wait_until = min(wait_until, loop.claim_until)
        woke = self._wait(wait_until - time.monotonic())
        loop.notified = woke == "notify"
        loop.kicked = loop.kicked or loop.notified  # finished callbacks: see _step
        if loop.notified and loop.claiming:
            # new jobs may be in a partition nobody leases yet: look soon (at most 5 cycles a second
            # while partitions are in use; while the last cycle saw none, at most one a second, so a
            # busy broker without partitions does not pay four statements per NOTIFY)
            stats = self.lease_stats
            kick = LEASE_KICK if stats is None or stats.owned or stats.fair_share else LEASE_KICK_UNUSED
            loop.next_lease = min(loop.next_lease, max(time.monotonic(), loop.last_lease + kick))

    def _lease_cycle(self, *, acquire: bool) -> bool:
        """One partition lease cycle (jobs.partitions); True when partitions were taken."""
        try:
            self.lease_stats = partition_leases_cycle(worker=self.worker_id, acquire=acquire)
        except DB_ERRORS:
            logger.exception("push dispatcher: partition lease cycle failed")
            connection.close()
            return False
        return bool(self.lease_stats.taken or self.lease_stats.stolen)

    def _leases_release(self) -> None:
        """Clean shutdown: give the leases back so other workers need not wait for them to expire."""
        try:
            partition_leases_release(worker=self.worker_id)
        except DB_ERRORS:
            logger.exception("push dispatcher: releasing partition leases failed")
            connection.close()

    @staticmethod
    def _timer(timers: list, at: float) -> None:
        """Add a wake-up time, at most one per 50 ms (a burst of failures needs one wake-up)."""
        at = round(at * 20) / 20 + 0.05
        if at not in timers:
            heapq.heappush(timers, at)


_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine_get() -> Engine:
    """The process's engine (created on first use; threads and connections outlive one task)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine
