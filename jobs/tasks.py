"""django-q2 entry points for push delivery and the sweeps. Thin: the work is in jobs.push and
jobs.housekeeping. Tasks carry no payloads, only wake-ups.

How dispatcher loops stay running (``BROKER_PUSH_DISPATCHERS`` per cluster name):
- A loop holds a *slot*: a session advisory lock (cluster name, slot number) on a connection of its
  own, so a worker killed with SIGKILL frees its slot with its connection.
- It claims and delivers for ``BROKER_PUSH_LOOP_SECONDS`` (below the Q_CLUSTER timeout, which stays
  below retry). Two seconds before the end it enqueues its successor; at the end it releases the
  slot and drains its callbacks in flight while the successor, already waiting on the slot's lock,
  takes over (the server grants the lock on release: no polling).
- Standby: a start that finds every slot taken waits (a blocking ``pg_advisory_lock`` under a
  ``lock_timeout``, one statement every ``STANDBY_CHUNK`` seconds) for a slot that no process of
  its own cluster instance (host and sentinel pid) holds or waits for: one *claim* lock per
  (instance, slot). So a new cluster started beside a running one (a rolling deploy) keeps a
  waiter on each slot the old one holds and takes it over at once when the old cluster stops or
  dies, while a single cluster never ties up a worker waiting on itself. Each new worker stands by
  right in django-q2's ``post_spawn`` (``on_worker_spawn``, connected in jobs/apps.py), not through
  the shared queue, whose tasks any cluster's pusher may take.
- Stopping: a cluster asked to stop hands its slots over and exits within its grace period. A
  worker running a loop (or standing by) learns of the stop from django-q2's own stop sequence (the
  sentinel's ``stop_event``, set when the cluster's main process gets SIGTERM: systemd's
  ``KillMode=mixed``, Kubernetes, ``make run``; ``cluster_stop_probe``, the one function that
  reaches into django-q2 for it) or from a SIGTERM of its own (the whole process group
  signalled): it releases its slot at once (the standby elsewhere takes it), stops claiming,
  drains the callbacks in flight and ends; a start arriving meanwhile returns. Idle workers keep
  django-q2's behaviour. docs/upgrades.md has the operator's side.
- A cut connection or a failover (docs/high-availability.md) ends no loop: the loop reconnects
  (jobs.push.dispatcher), ``Slot.keep`` takes the slot again every second on a new connection
  (or stops this loop when another took it meanwhile), a start during an outage waits for the
  database (``OUTAGE_WAIT``), and a hand-over that falls in one is retried within the task budget.
- The ``broker-push-ensure`` schedule starts one task per slot every minute (``setup_schedules``)
  as the safety net.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time

import psycopg
from django.conf import settings
from django.db import connection
from django_q.tasks import async_task

from broker.db.errors import DB_ERRORS, DB_RETRY
from broker.db.listen import dedicated_connect
from broker.heap import heap_freeze
from broker.queries import Q as BROKER_Q
from jobs.housekeeping import housekeeping_run
from jobs.pull.doorbell import doorbell_thread_start
from jobs.push.dispatcher import engine_get
from jobs.push.queries import Q

logger = logging.getLogger(__name__)
SLOT_CHECK = 1.0  # seconds between checks that the loop still holds its slot (Slot.keep)
OUTAGE_WAIT = 60.0  # a dispatcher started while the database is unreachable waits this long for it
STANDBY_CHUNK = 8.0  # seconds one blocking wait for a slot lasts at most (then the slots are tried again)
TASK_STANDBY = 45.0  # a queued task stands by at most this long, so its loop still fits the task timeout
SUCCESSOR_WAIT = 30.0
WATCH_PERIOD = 0.25  # seconds between looks at the cluster's stop event (no database involved)  # the successor's argument (read by earlier releases as their wait)


def _instance() -> str:
    """This cluster instance: the host and the sentinel's pid (the parent of a django-q2 worker)."""
    return f"{socket.gethostname()}:{os.getppid()}"


class Slot:
    """A dispatcher slot: ``pg_advisory_lock(hashtext('broker-push:<cluster>'), n)`` held on a
    dedicated connection (Django's own may be closed and reopened by django-q2 between tasks),
    with this instance's claim on it (``broker-push-claim:<cluster>:<instance>``, n) beside it.

    The locks live as long as that connection: a cut connection (a proxy restart,
    ``pg_terminate_backend``, a failover) frees them, and ``keep`` takes the slot again on a new
    one. ``lock`` orders the loop's thread and the thread that stops it (``stop``)."""

    def __init__(self) -> None:
        self.conn = None  # connected on first use
        cluster = settings.Q_CLUSTER.get("name", "broker")
        self.key = f"broker-push:{cluster}"
        self.claim_key = f"broker-push-claim:{cluster}:{_instance()}"
        self.number: int | None = None
        self.claimed: int | None = None  # the slot this connection holds the instance's claim on
        self.lock = threading.Lock()
        self.stopped = False

    def _conn(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = dedicated_connect(application_name="broker-push-slot")
            self.claimed = None  # (the old connection's locks went with it)
        return self.conn

    def _try(self, key: str, n: int) -> bool:
        return bool(self._conn().execute(Q.dispatcher_slot_lock.sql, [key, n]).fetchone()[0])

    def _unclaim(self, n: int) -> None:
        self._conn().execute(BROKER_Q.advisory_unlock.sql, [self.claim_key, n])

    def _scan(self, slots: int) -> int | None:
        """Look at the slots this instance may claim (no sibling process holds or waits for them):
        take the first free one (returns its number, ``self.number`` set), else keep the claim on
        the first taken one to stand by for (``self.claimed``; returns None)."""
        for n in range(slots):
            mine = self.claimed == n or self._try(self.claim_key, n)
            if not mine:
                continue  # a sibling holds or waits for it
            if self._try(self.key, n):
                if self.claimed is not None and self.claimed != n:
                    self._unclaim(self.claimed)
                self.claimed = self.number = n
                return n
            if self.claimed is None:
                self.claimed = n
            elif self.claimed != n:
                self._unclaim(n)
        return None

    def _wait(self, n: int, seconds: float) -> bool:
        """Block on slot ``n``'s lock for up to ``seconds`` (the server's lock_timeout)."""
        conn = self._conn()
        conn.execute(BROKER_Q.settings_session_set.sql, {  # (pg_stat_activity tells standbys from loops)
            "names": ["lock_timeout", "application_name"],
            "values": [f"{max(1, int(seconds * 1000))}ms", "broker-push-standby"]})
        try:
            conn.execute(BROKER_Q.advisory_lock_wait.sql, [self.key, n])
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
            return False  # timed out, or cancelled by a stop (``stop``)
        conn.execute(BROKER_Q.settings_session_set.sql, {"names": ["application_name"], "values": ["broker-push-slot"]})
        self.number = n
        return True

    def acquire(self, slots: int, standby: float | None, *, outage: float = 0.0, stopping=lambda: False) -> int | None:
        """A free slot at once; else stand by for the slot this instance may claim, for up to
        ``standby`` seconds (None: until one comes free or the cluster stops); None when there is
        nothing to claim, the time is up or the cluster stops. While the database cannot be reached
        it keeps trying for up to ``outage`` seconds, then raises the database error."""
        deadline = None if standby is None else time.monotonic() + max(0.0, standby)
        down_until = None
        while not stopping():
            try:
                if self._scan(slots) is not None:
                    return self.number
                if self.claimed is None:
                    return None  # every slot is held or waited for by this instance
                left = STANDBY_CHUNK if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return None
                if self._wait(self.claimed, min(left, _chunk())):
                    return self.number
                down_until = None
            except DB_ERRORS:
                self._close()
                now = time.monotonic()
                down_until = now + max(0.0, outage) if down_until is None else down_until
                if now >= down_until or stopping():
                    raise
                time.sleep(DB_RETRY)
        return None

    def keep(self) -> bool | None:
        """Whether this loop still holds its slot: True (re-taken on a new connection after a cut
        one; also once stopped), False when another loop took it meanwhile, None while the database
        cannot be reached (asked again at the next check)."""
        with self.lock:
            if self.stopped or self.alive():
                return True
            self._close()
            try:
                if not self._try(self.key, self.number):
                    return False
                if self._try(self.claim_key, self.number):
                    self.claimed = self.number
                return True
            except DB_ERRORS:
                self._close()
                return None

    def claim_drop(self) -> None:
        """Give up this instance's claim (the hand-over: the successor may stand by for the slot)."""
        with self.lock:
            if self.stopped or self.claimed is None or self.conn is None or self.conn.closed:
                return
            try:
                self.conn.execute(BROKER_Q.advisory_unlock.sql, [self.claim_key, self.claimed])
            except DB_ERRORS:
                self._close()  # the slot is re-taken by ``keep``, which the release follows anyway
            self.claimed = None

    def alive(self) -> bool:
        if self.conn is None or self.conn.closed:
            return False
        try:
            self.conn.execute(BROKER_Q.db_ping.sql)
            return True
        except Exception:  # noqa: BLE001
            return False

    def stop(self) -> None:
        """From the stopping thread: free the slot now (a standby elsewhere takes it at once) and
        never take it again; a blocking wait in progress is cancelled."""
        conn = self.conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel_safe(timeout=2.0)
            except Exception:  # noqa: BLE001 - closing below frees the locks all the same
                pass
        with self.lock:
            self.stopped = True
            self._close()

    def release(self) -> None:
        """Closing the connection frees the slot and the claim (idempotent)."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        self.claimed = None


def _chunk() -> float:
    """One blocking wait: below the session's statement bound (BROKER_DB_TIMEOUT) when it has one."""
    bound = float(settings.BROKER_DB_TIMEOUT or 0)
    return STANDBY_CHUNK if bound <= 0 else max(0.5, min(STANDBY_CHUNK, bound * 0.8))


class _Stop:
    """How this worker process learns that its cluster is stopping. ``probe`` tells whether
    django-q2's stop event is set (``cluster_stop_probe``: the cluster's main process sets it on
    SIGTERM); ``signalled``: this process got a SIGTERM itself (its whole group was signalled: the
    sentinel is gone too, so the process exits once its loop is over). ``hooks`` run once, from a
    helper thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.probe = None  # () -> bool, or None outside a django-q2 worker
        self.signalled = False
        self.active = 0  # loops or standbys running in this process (the SIGTERM handler reads it)
        self.hooks: list = []
        self.lock = threading.Lock()
        self.watching = False

    def stopping(self) -> bool:
        return self.event.is_set() or (self.probe is not None and self.probe())

    def now(self) -> None:
        with self.lock:
            if self.event.is_set():
                return
            self.event.set()
            hooks = list(self.hooks)
        logger.info("push dispatcher: cluster stopping; handing the slot over")
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001
                logger.exception("push dispatcher: stop hook failed")

    def hook(self, fn) -> None:
        """Run ``fn`` when the stop comes (at once when it already came)."""
        with self.lock:
            self.hooks.append(fn)
            late = self.event.is_set()
        if late or self.stopping():
            threading.Thread(target=self.now if not late else fn, daemon=True).start()

    def unhook(self, fn) -> None:
        with self.lock:
            if fn in self.hooks:
                self.hooks.remove(fn)

    def watch(self) -> None:
        """A thread that notices the cluster's stop (started once per process): it asks ``probe``
        four times a second, no database involved."""
        with self.lock:
            if self.watching or self.probe is None:
                return
            self.watching = True
        probe = self.probe

        def watch() -> None:
            while not self.event.is_set():
                if probe():
                    self.now()
                    return
                time.sleep(WATCH_PERIOD)

        threading.Thread(target=watch, name="push-stop-watch", daemon=True).start()


_stop = _Stop()


def cluster_stop_probe():
    """Whether this django-q2 worker's cluster is stopping, as a function; None outside a worker.

    The one place that reaches into django-q2's and multiprocessing's internals: no public API
    tells a worker busy in a long task that its cluster is stopping (django-q2 puts ``STOP`` in the
    task queue, read between tasks; its signals say nothing of a stop). Called in ``post_spawn``
    from a freshly forked worker, whose stack still holds the frames of the ``Sentinel`` that forked
    it (``spawn_worker``): its ``stop_event`` is the event the main process sets on SIGTERM. The
    function reads the event's flag without its lock (``_flag``, a semaphore: 1 once set): waiting
    on the event would make a thread of this worker one of its sleepers, and a worker that ends
    while one of its threads sleeps on it (recycled, killed) leaves the main process hanging in
    ``Event.set`` at the next stop (django-q2 #346: a SIGTERM to the whole group kills the sentinel
    while it waits on the event). When either internal changes this returns None and a worker
    learns of a stop from its own SIGTERM only; tests/jobs/test_q_stop.py fails on such an upgrade
    of django-q2 or Python, against a real Sentinel and a real forked worker."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "Sentinel" and type(owner).__module__ == "django_q.cluster":
            flag = getattr(getattr(owner, "stop_event", None), "_flag", None)
            value = getattr(flag, "get_value", None)
            return (lambda: value() > 0) if callable(value) else None
        frame = frame.f_back
    return None


def _on_sigterm(signum, frame) -> None:
    """A worker's SIGTERM: with a loop (or a standby) running, stop it gracefully and exit after it;
    otherwise django-q2's behaviour (the default action: the process ends)."""
    if _stop.active:
        _stop.signalled = True
        threading.Thread(target=_stop.now, daemon=True).start()
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def push_dispatch(wait: float = 0.0) -> str:
    """Run one dispatcher loop if a slot is free, or stand by for one (see module docstring).
    ``wait`` is the argument earlier releases gave a successor; a task stands by at most
    ``TASK_STANDBY`` seconds so its loop still fits django-q2's timeout."""
    return _dispatch(standby=TASK_STANDBY, started=time.monotonic())


def _dispatch(*, standby: float | None, started: float | None) -> str:
    """Take a slot (or stand by for one) and run a loop in it. ``started``: when the django-q2 task
    began (its timeout counts from there), None when not run as a task (``on_worker_spawn``)."""
    slots = int(settings.BROKER_PUSH_DISPATCHERS or 0)
    if slots <= 0:
        return "push dispatch disabled (BROKER_PUSH_DISPATCHERS=0)"
    if _stop.stopping():
        return "cluster stopping: no dispatcher loop"
    _stop.watch()
    slot = Slot()
    _stop.active += 1
    _stop.hook(slot.stop)
    try:
        try:
            number = slot.acquire(slots, standby, outage=OUTAGE_WAIT, stopping=_stop.stopping)
        except DB_ERRORS as exc:
            return f"database unavailable for {OUTAGE_WAIT:g} s ({type(exc).__name__}); no dispatcher loop"
        if number is None:
            return ("cluster stopping: no dispatcher loop" if _stop.stopping()
                    else "every dispatcher slot is taken (and waited for by this cluster)")
        return _loop(slot, number, slots, started=time.monotonic() if started is None else started)
    finally:
        _stop.unhook(slot.stop)
        slot.release()
        _stop.active -= 1
        if _stop.signalled and not _stop.active:
            _exit()


def _loop(slot: Slot, number: int, slots: int, *, started: float) -> str:
    """Claim and deliver in slot ``number`` until the hand-over or a stop."""
    # the whole task stays within django-q2's timeout (else the worker is killed mid-loop)
    budget = float(settings.Q_CLUSTER.get("timeout") or 150) - 10.0
    doorbell_thread_start()  # this process's doorbell ringer thread (rings while it holds its lock)
    left = budget - (time.monotonic() - started)  # (less after waiting for the database or a slot)
    claim_for = max(5.0, min(float(settings.BROKER_PUSH_LOOP_SECONDS), left - 5.0))
    # Whatever stays running past the task budget is abandoned (redelivered after its deadline).
    drain_for = max(5.0, left - claim_for)
    handed_over, superseded = [], []
    stop = threading.Event()

    def stopped() -> None:  # from the stopping thread: no more claims; the slot is freed by slot.stop
        stop.set()

    _stop.hook(stopped)

    def hand_over() -> None:
        if not superseded and not _stop.stopping():
            slot.claim_drop()
            _enqueue_successor()
            handed_over.append(True)

    checked = [0.0]  # when the last check ended

    def keep() -> None:
        # checks that fell due together (a slow step, a silent connection: one check can take
        # seconds) run once, not back to back past the task's budget
        if time.monotonic() - checked[0] < SLOT_CHECK:
            return
        try:
            if slot.keep() is False:
                superseded.append(True)
                stop.set()  # drain and end: the loop that took the slot goes on (and hands over)
                logger.warning("push dispatcher slot %s: taken by another loop after a lost connection; "
                               "this loop stops", number)
        finally:
            checked[0] = time.monotonic()

    checks = [(t * SLOT_CHECK, keep) for t in range(1, int((claim_for - 2.0) / SLOT_CHECK))]
    try:
        stats = engine_get().run(claim_for=claim_for, drain_for=drain_for, wake_share=(number, slots), stop=stop,
                                 events=checks + [(max(0.0, claim_for - 2.0), hand_over),
                                                  (claim_for, slot.release)])
    finally:
        _stop.unhook(stopped)
    if _stop.stopping():
        stats["stopped"] = True  # handed over at the stop: a standby elsewhere holds the slot now
    elif not handed_over and not superseded:
        # The database was down at hand-over time: without a successor this slot would stay
        # empty until the minute schedule. Keep trying within the task budget.
        stats["late_hand_over"] = _enqueue_successor_retrying(budget - (time.monotonic() - started))
    logger.info("push dispatcher slot %s: %s", number, stats)
    return f"slot {number}: {stats}"


def _exit() -> None:
    """End a worker whose group got SIGTERM once its loop is over (its sentinel is gone, so
    nothing would ever send it django-q2's STOP)."""
    connection.close()
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(0)


def _enqueue_successor_retrying(budget: float) -> bool:
    """Enqueue the successor, retrying every second for ``budget`` seconds (database outage)."""
    deadline = time.monotonic() + budget
    while True:
        try:
            _enqueue_successor()
            return True
        except DB_ERRORS:
            connection.close()
            if time.monotonic() + 1.0 > deadline:
                logger.error("push dispatcher: no successor enqueued (database unavailable); the "
                             "broker-push-ensure schedule starts one")
                return False
            time.sleep(1.0)


def _enqueue_successor() -> None:
    async_task("jobs.tasks.push_dispatch", SUCCESSOR_WAIT, task_name="push-dispatch", save=False)


def push_dispatch_ensure() -> int:
    """Enqueue one dispatcher start per slot; those finding nothing to take or claim return at once."""
    slots = int(settings.BROKER_PUSH_DISPATCHERS or 0)
    for _ in range(slots):
        async_task("jobs.tasks.push_dispatch", 0.0, task_name="push-dispatch", save=False)
    return slots


def maintenance() -> dict:
    """The fallback schedule (``broker-maintenance``, every minute): the housekeeping routine the
    dispatcher loops run, every step once, so nothing waits for a loop (BROKER_PUSH_DISPATCHERS=0)."""
    return housekeeping_run()


def on_worker_spawn(sender=None, proc_name=None, **kwargs) -> None:
    """django-q2 ``post_spawn``, in each new worker before it reads tasks: learn how the cluster
    stops, then take a free slot or stand by for one this instance does not hold (module
    docstring); a worker with nothing to claim goes on to its tasks at once. First, what the worker
    loaded (Django, the tasks) goes out of the collector's full passes (broker.heap)."""
    if settings.BROKER_GC_FREEZE and not settings.Q_CLUSTER.get("sync"):
        heap_freeze()
    if int(settings.BROKER_PUSH_DISPATCHERS or 0) <= 0 or settings.Q_CLUSTER.get("sync"):
        return
    _stop.probe = cluster_stop_probe()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        outcome = _dispatch(standby=None, started=None)
        logger.debug("push dispatcher at worker start: %s", outcome)
    except Exception:  # noqa: BLE001 - the minute schedule starts one otherwise
        logger.exception("push dispatcher at worker start failed")
    finally:
        connection.close()  # do not carry this connection into the worker's first task
