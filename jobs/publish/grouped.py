"""Group commit: the single publishes that arrive together in one process share one transaction.

Each process runs one publishing thread (started on first use) with its own database connection.
A request parses and validates its message and hands it over with its credentials: a request
thread waits for its answer (``message_publish_grouped``), the web server's event loop gets it by
a callback (``publish_submit``: one call per batch, for all of its items). The thread takes
everything handed over since its last commit, authenticates each channel and producer once, takes a
rate-limited producer's tokens for all of its messages in one statement, stores each (channel,
producer) group's messages in one statement (``messages_publish``), commits once (a durable commit)
and only then answers each request: a 201 comes only after its own row is durable. What fails fails
only its own request: a refusal (token, backlog cap, rate limit, duplicate id) is that item's; a
statement that fails rolls the batch back and its items are published again one by one. A batch
starts at most once per ``BROKER_PUBLISH_WINDOW`` (what arrives meanwhile joins it; after a quiet
spell, or for a producer publishing one message at a time, the first publish goes at once).

Publishes inside a transaction (tests; a caller's own ``atomic``), keyed ones (their partition
checks refuse a whole statement) and ``BROKER_PUBLISH_GROUP`` off publish in the request's thread.

**Slow is not stuck.** A batch that takes long (an fsync stall, a lock, 500 messages) is waited for:
its round trips are bounded (``BROKER_DB_TIMEOUT``, else ``PUBLISH_BOUND``: the server cancels the
statement first, so a refused batch is rolled back, never committed after its 503). The thread's
progress is watched (``_Watch``): when a batch has run for ``SLOW_AFTER`` its backend is looked up
in ``pg_stat_activity``: working on it (``active``) is slow and left alone; idle or gone (the request
or its answer was lost, or the thread hangs outside the database) is stuck: a new thread takes over
the queue (the stuck one still answers its own batch when its bounded round trip ends).

**Admission** (``publish_admission``): a publish is refused at once (503 ``overloaded`` with
``Retry-After``) when the publishes queued before it have waited longer than
``BROKER_PUBLISH_ADMIT_WAIT`` (the thread, the database or the machine cannot keep up), or the queue
holds more than ``QUEUE_MAX``: what is accepted is answered within a second instead of everything
waiting longer and longer. Optionally (``BROKER_PUBLISH_ADMIT_PRESSURE``) also when the machine's CPU
is saturated (broker.pressure) and the queue or the batch in flight has waited
``BROKER_PUBLISH_ADMIT_PRESSED_WAIT``: the load the deliveries could not follow is shed sooner.
And publishes over a rate while the push deliveries fall behind (jobs.publish.admission): publishing
that keeps up is not enough when the deliveries do not.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.array import ListBinaryDumper

from broker.db.backend.base import round_trip_bound
from broker.db.errors import DB_ERRORS
from broker.db.run import query_fetchall
from broker.errors import Conflict, DomainError, Unavailable
from broker.pressure import cpu_pressure
from broker.queries import Q as BROKER_Q
from jobs.publish.admission import lag_admission
from jobs.publish.auth import PublishContext, producer_rate_grant, publish_authenticate
from jobs.publish.messages import NewMessage, message_publish, messages_publish
from jobs.publish.queries import Q
from jobs.publish.refusals import publish_refusal_count

logger = logging.getLogger(__name__)
BATCH_MAX = 500  # messages per transaction
QUEUE_MAX = 20 * BATCH_MAX  # publishes waiting for the thread: past this, new ones are refused
WAIT_MAX = 300.0  # seconds a request waits for its answer: a safety net (the thread's round trips are bounded)
PUBLISH_BOUND = 30.0  # seconds: the thread's round trips when BROKER_DB_TIMEOUT is 0 (unbounded elsewhere)
SLOW_AFTER = 1.0  # seconds a batch runs before the watch asks the database whether it is working on it
IDLE_CHECK = 1.0  # seconds without a batch after which the connection is checked before the next
CONCURRENT_WITHIN = 1.0  # seconds: the window holds a batch only this soon after two publishes overlapped
OVERLOADED_RETRY_AFTER = 1  # seconds, the Retry-After of a publish refused by admission
WORKING = ("active", "fastpath function call")  # pg_stat_activity states of a backend running a statement


@dataclass(eq=False, slots=True)
class PublishItem:
    """One publish handed to the thread; ``message_id`` (201) or ``error`` once answered."""

    channel_id: str
    channel_token: str | None
    producer_id: str | None
    producer_token: str | None
    message: NewMessage
    done: threading.Event | None = None  # a waiting request thread (message_publish_grouped)
    reply: object = None  # or a callable taking the answered items of a batch (publish_submit)
    submitted: float = 0.0
    message_id: str | None = None
    error: BaseException | None = None
    answered: bool = False

    @property
    def credentials(self) -> tuple:
        return self.channel_id, self.channel_token, self.producer_id, self.producer_token


class GroupPublisher:
    """The process's publishing thread, its queue of waiting publishes and the watch of its progress."""

    def __init__(self) -> None:
        self._queue: deque[PublishItem] = deque()
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the publishing thread waits here for publishes
        self._watched = threading.Condition(lock)  # the watch waits here for a batch
        self._thread: threading.Thread | None = None
        self._watch: threading.Thread | None = None
        self._closed = threading.Event()
        self._pending = 0  # publishes handed over and not answered yet
        self._idle = 0  # threads waiting for a publish (submit wakes them; not one that holds a batch open)
        self._overlapped = float("-inf")  # when two publishes were last pending at once
        self.batches = 0  # transactions committed (tests, benchmarks)
        self.generation = 0  # bumped when a stuck thread is replaced
        self.replaced = 0  # stuck threads replaced (tests, /metrics)
        self.slow = 0  # slow batches the watch looked at and left alone
        self.batch_since: float | None = None  # when the current batch began (None: no batch)
        self.backend_pid: int | None = None  # the thread's database session

    # --- handing over --------------------------------------------------------------------------

    def submit(self, item: PublishItem) -> None:
        item.submitted = time.monotonic()
        with self._cond:
            self._queue.append(item)
            self._pending += 1
            if self._pending > 1:
                self._overlapped = item.submitted
            if self._thread is None or not self._thread.is_alive():
                self._start()
            if self._idle or len(self._queue) >= BATCH_MAX:  # (not while it holds a batch open: it comes back)
                self._cond.notify()

    def _start(self) -> None:
        """A publishing thread (the lock held), and the watch of its progress."""
        self.generation += 1
        self._thread = threading.Thread(target=self._run, args=(self.generation,), name="broker-publish",
                                        daemon=True)
        self._thread.start()
        if self._watch is None or not self._watch.is_alive():
            self._watch = threading.Thread(target=self._watching, name="broker-publish-watch", daemon=True)
            self._watch.start()

    def admission(self) -> int | None:
        """None: take a publish now; else the seconds of its refusal's Retry-After (module docstring)."""
        if lag_admission.refuse():  # the deliveries are behind (jobs.publish.admission)
            publish_refusal_count(reason="delivery_lag")
            return OVERLOADED_RETRY_AFTER
        limit = float(settings.BROKER_PUBLISH_ADMIT_WAIT)
        if limit <= 0:
            return None
        queue = self._queue
        try:
            oldest = queue[0].submitted
        except IndexError:
            oldest = time.monotonic()
            if self.batch_since is None:
                return None
        now = time.monotonic()
        waited = now - oldest
        # under pressure, a new publish waits out the batch in flight too
        running = now - (self.batch_since or now)
        if waited > limit or len(queue) > QUEUE_MAX or self._pressed(max(waited, running)):
            publish_refusal_count(reason="publishing_queue")
            return OVERLOADED_RETRY_AFTER
        return None

    @staticmethod
    def _pressed(waited: float) -> bool:
        """The tighter bound while the machine's CPU is saturated (broker.pressure): there, a queue
        that waits at all only grows, and the deliveries fall behind with it."""
        bound = float(settings.BROKER_PUBLISH_ADMIT_PRESSURE)
        if bound <= 0 or waited <= float(settings.BROKER_PUBLISH_ADMIT_PRESSED_WAIT):
            return False
        share = cpu_pressure.share()
        return share is not None and share >= bound

    def close(self) -> None:
        """Close the thread's connection (it reconnects on its next batch) and wait for it: before a
        test database is dropped."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                return
            self._closed.clear()
            self._queue.append(None)
            self._cond.notify_all()
        self._closed.wait(10)

    # --- the thread ---------------------------------------------------------------------------------

    def _run(self, generation: int) -> None:
        last = float("-inf")
        session = None
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue and self.generation == generation:
                    self._cond.wait()
                self._idle -= 1
                if self.generation != generation:  # replaced while stuck: the new thread has the queue
                    break
                # a producer publishing one message at a time (never two pending) is not held: only
                # concurrent publishers gather (as PostgreSQL's commit_delay waits only with siblings)
                concurrent = time.monotonic() - self._overlapped < CONCURRENT_WITHIN
                window = float(settings.BROKER_PUBLISH_WINDOW) if concurrent else 0.0
                while (hold := last + window - time.monotonic()) > 0 and len(self._queue) < BATCH_MAX:
                    self._cond.wait(hold)
                batch = [self._queue.popleft() for _ in range(min(BATCH_MAX, len(self._queue)))]
                idle, last = time.monotonic() - last, time.monotonic()
                self.batch_since = last
                self._watched.notify()  # the watch: a batch began
            items = [item for item in batch if item is not None]
            try:
                # (only while BROKER_DB_TIMEOUT is 0: then this thread bounds its own round trips)
                with round_trip_bound(PUBLISH_BOUND + float(settings.DB_TIMEOUT_GRACE)):
                    if items:
                        connection.close_if_unusable_or_obsolete()
                        if idle > IDLE_CHECK and connection.connection is not None and not connection.is_usable():
                            connection.close()  # broken while idle (a restart, a failover): the batch reconnects
                        connection.ensure_connection()
                        if connection.connection is not session:
                            session = connection.connection
                            self._session_setup(session)
                        lag_admission.refresh()
                        self._publish(items)
            except BaseException as exc:  # noqa: BLE001 - every waiting request gets an answer
                logger.exception("grouped publish failed")
                for item in items:
                    if not item.answered:
                        item.message_id, item.error = None, exc
            finally:
                with self._cond:
                    self.batch_since = None
                    self._pending -= len(items)
                _answer(items)
                if len(items) < len(batch):  # close() asked for it
                    connection.close()
                    session = None
                    self._closed.set()
        connection.close()  # a replaced thread's connection (the new thread has its own)

    def _session_setup(self, session) -> None:
        """The thread's new database session: its pid (the watch looks it up), binary lists, and
        bounds the server enforces before the client gives up (a batch answered 503 is rolled back,
        never committed later): its statements' when BROKER_DB_TIMEOUT is 0 (PUBLISH_BOUND), and its
        lock waits always (the consumers' rows the fan-out locks FOR KEY SHARE; lock_timeout also
        covers a wait at COMMIT, after statement_timeout has ended with the statement)."""
        self.backend_pid = session.info.backend_pid
        # lists (a batch's columns) in binary: psycopg quotes every element of a text array in Python
        # (measured: 36 -> 7 us per message of a batch); PostgreSQL reads a binary one without unquoting
        session.adapters.register_dumper(list, ListBinaryDumper)
        timeout = float(settings.BROKER_DB_TIMEOUT or 0)
        names, values = ["lock_timeout"], [f"{int((timeout or PUBLISH_BOUND) * 1000)}ms"]
        if timeout <= 0:
            names += ["statement_timeout", "idle_in_transaction_session_timeout"]
            values += [f"{int(PUBLISH_BOUND * 1000)}ms", f"{int(PUBLISH_BOUND * 3000)}ms"]
        query_fetchall(BROKER_Q.session_settings_set, {"names": names, "values": values})

    def _publish(self, items: list[PublishItem]) -> None:
        """Store ``items``; each one's outcome is set only once its row is committed (or refused)."""
        groups = self._authenticated(items)
        outcomes: list[tuple[PublishItem, str | None, BaseException | None]] = []
        try:
            # one group (the usual batch): its one statement is its own transaction, without the round
            # trips of BEGIN and COMMIT
            with transaction.atomic() if len(groups) > 1 else nullcontext():
                for ctx, members in groups:
                    results = messages_publish(ctx=ctx, messages=[item.message for item in members])
                    outcomes += [(item, mid, None) if created else (item, None, _duplicate())
                                 for item, (mid, created) in zip(members, results)]
            self.batches += 1
        except (DomainError, *DB_ERRORS) as exc:
            if len(items) == 1 and not isinstance(exc, DomainError):
                raise
            logger.info("grouped publish of %d messages rolled back (%s); publishing them one by one",
                        len(items), type(exc).__name__)
            for ctx, members in groups:
                for item in members:
                    try:
                        mid = message_publish(ctx=ctx, message=item.message)  # its own commit
                    except (DomainError, *DB_ERRORS) as one:
                        item.message_id, item.error, item.answered = None, one, True
                    else:
                        item.message_id, item.error, item.answered = mid, None, True
            return
        for item, mid, error in outcomes:  # committed: now, and only now, the answers
            item.message_id, item.error, item.answered = mid, error, True

    @staticmethod
    def _authenticated(items: list[PublishItem]) -> list[tuple[PublishContext, list[PublishItem]]]:
        """Each item's channel and producer checked once per set of credentials; a refused item gets
        its error. A rate-limited producer's items take their tokens in one statement, as many as its
        bucket holds, in their order (as separate requests would); the rest are refused (429).
        Returns the items to store grouped by (channel, producer)."""
        contexts: dict[tuple, PublishContext | DomainError] = {}
        accepted: list[tuple[PublishItem, PublishContext]] = []
        for item in items:
            key = item.credentials
            if key not in contexts:
                try:
                    contexts[key] = publish_authenticate(channel_id=item.channel_id, channel_token=item.channel_token,
                                                         producer_id=item.producer_id,
                                                         producer_token=item.producer_token)
                except DomainError as exc:
                    contexts[key] = exc
            ctx = contexts[key]
            if isinstance(ctx, DomainError):
                item.error, item.answered = ctx, True
            else:
                accepted.append((item, ctx))
        limited: dict[int, tuple[PublishContext, list[PublishItem]]] = {}
        for item, ctx in accepted:
            if ctx.rate:
                limited.setdefault(ctx.producer_pk, (ctx, []))[1].append(item)
        refused: set[int] = set()
        for ctx, members in limited.values():  # one statement per producer, whatever its channels
            granted, refusal = producer_rate_grant(ctx=ctx, n=len(members))
            for item in members[granted:]:
                item.error, item.answered = refusal, True
                refused.add(id(item))
        groups: dict[tuple, tuple[PublishContext, list[PublishItem]]] = {}
        for item, ctx in accepted:
            if id(item) not in refused:
                group = groups.get((ctx.channel_pk, ctx.producer_pk))
                if group is None:  # a limited producer's tokens are spent: messages_publish takes none
                    group = groups[(ctx.channel_pk, ctx.producer_pk)] = (
                        dataclasses.replace(ctx, rate=None) if ctx.rate else ctx, [])
                group[1].append(item)
        return list(groups.values())

    # --- the watch -------------------------------------------------------------------------------------

    def _watching(self) -> None:
        """(its own thread) A batch running for SLOW_AFTER: slow (its backend working) or stuck."""
        while True:
            with self._cond:
                while self.batch_since is None:
                    self._watched.wait()
                since, generation, pid = self.batch_since, self.generation, self.backend_pid
            time.sleep(max(0.0, since + SLOW_AFTER - time.monotonic()))
            with self._cond:
                if self.batch_since != since or self.generation != generation:
                    continue  # that batch is done
            verdict = self._verdict(pid)
            with self._cond:
                if self.batch_since != since or self.generation != generation:
                    continue
                if verdict == "slow":
                    self.slow += 1
                elif verdict == "stuck":
                    self.replaced += 1
                    logger.warning("the publishing thread is stuck (its database session %s is not working on "
                                   "its batch of %.1f s): a new thread takes over the queue", pid,
                                   time.monotonic() - since)
                    self.batch_since = None
                    self._start()
                    self._cond.notify_all()
                    continue
            time.sleep(SLOW_AFTER)  # slow, or the database did not answer: look again later

    @staticmethod
    def _verdict(pid: int | None) -> str:
        """"slow" (the backend runs the batch's statement), "stuck" (it does not: idle, gone, or no
        session yet), or "unknown" (the database does not answer here either: a new thread would
        not do better; the batch's bounded round trip ends it)."""
        if pid is None:
            return "stuck"
        try:
            rows = query_fetchall(Q.publisher_backend_state, {"pid": pid})
        except DB_ERRORS:
            return "unknown"
        finally:
            connection.close()  # the watch keeps no session between its rare looks
        return "slow" if rows and rows[0][0] in WORKING else "stuck"


def _answer(items: list[PublishItem]) -> None:
    """Hand the answers over: each waiting thread's event, one call per reply for its items."""
    replies: dict[int, tuple[object, list[PublishItem]]] = {}
    for item in items:
        if item.done is not None:
            item.done.set()
        elif item.reply is not None:
            replies.setdefault(id(item.reply), (item.reply, []))[1].append(item)
    for reply, answered in replies.values():
        try:
            reply(answered)
        except Exception:  # noqa: BLE001 - a closed event loop (a worker shutting down) must not stop the thread
            logger.exception("could not hand %d publish answers over", len(answered))


def _duplicate() -> Conflict:
    return Conflict("duplicate_message_id", "duplicate message id for channel")


def _overloaded(retry_after: int) -> Unavailable:
    return Unavailable("overloaded", f"the broker is over its capacity: retry after {retry_after} s",
                       retry_after=retry_after)


_publisher = GroupPublisher()


def publish_grouped_here(*, message: NewMessage) -> bool:
    """Whether a publish of ``message`` goes through the publishing thread (else in the caller's)."""
    return bool(settings.BROKER_PUBLISH_GROUP) and not connection.in_atomic_block and message.partition_key is None


def publish_admission() -> Unavailable | None:
    """None when a publish may be taken now; else the 503 ``overloaded`` refusal to answer at once."""
    retry = _publisher.admission()
    return None if retry is None else _overloaded(retry)


def publish_submit(item: PublishItem) -> None:
    """Hand ``item`` (with its ``reply``) to the publishing thread; ``reply`` gets it once answered."""
    _publisher.submit(item)


def message_publish_grouped(*, channel_id: str, channel_token: str | None, producer_id: str | None,
                            producer_token: str | None, message: NewMessage) -> str:
    """Authenticate and publish one message, sharing the transaction of the publishes that arrive
    with it (see the module docstring); the same answers and errors as ``publish_authenticate`` then
    ``message_publish``, and 503 ``overloaded`` from admission. Returns the message id once its
    commit is durable."""
    item = PublishItem(channel_id, channel_token, producer_id, producer_token, message)
    if not publish_grouped_here(message=message):
        return _publish_here(item)
    refusal = publish_admission()
    if refusal is not None:
        raise refusal
    item.done = threading.Event()
    _publisher.submit(item)
    if not item.done.wait(WAIT_MAX):  # not known whether it was stored: as a lost connection, 503
        raise Unavailable("database_unavailable", "the database is unavailable, retry shortly", retry_after=1)
    if item.error is not None:
        raise item.error
    return item.message_id


def _publish_here(item: PublishItem) -> str:
    """``item`` published in the request's own thread and transaction (not grouped)."""
    ctx = publish_authenticate(channel_id=item.channel_id, channel_token=item.channel_token,
                               producer_id=item.producer_id, producer_token=item.producer_token)
    return message_publish(ctx=ctx, message=item.message)


def grouped_publisher_close() -> None:
    """Close the publishing thread's connection (tests, before the database is dropped)."""
    _publisher.close()

