"""Group commit: the single publishes that arrive together in one process share one transaction.

Each process runs one publishing thread (started on first use) with its own database connection.
A request thread parses and validates its message, hands it over with its credentials and waits;
the thread takes everything handed over since its last commit, authenticates each channel and
producer once, stores each (channel, producer) group's messages in one statement
(``messages_publish``), commits once (a durable commit, as before) and answers each request: a 201
still comes only after its own row is durable. What fails fails only its own request: a refusal
(token, backlog cap, rate limit, duplicate id) is that item's; a statement that fails rolls the
batch back and its items are published again one by one. One backend serves a process's
publishes (its caches stay warm) and, under load, one commit carries many messages: a batch starts
at most once per ``BROKER_PUBLISH_WINDOW`` (what arrives meanwhile joins it; after a quiet spell
the first publish goes at once), as the transaction's cost is nearly the same for one message or ten.
Only publishes that overlap are held: a producer that publishes one message at a time, waiting for
each answer, never has two pending and is never held.

Publishes inside a transaction (tests; a caller's own ``atomic``), keyed ones (their partition
checks refuse a whole statement) and ``BROKER_PUBLISH_GROUP`` off publish in the request's thread.

One thread must not become one point of waiting: its connection is checked before a batch that
follows a quiet second (a server restart or a failover leaves it broken while idle), and a request
whose message is still queued after ``TAKEN_WITHIN`` seconds (the thread stuck on a dead
connection until its round trip bound) takes it back and publishes it in its own thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.db.errors import DB_ERRORS
from broker.errors import Conflict, DomainError, Unavailable
from jobs.publish.auth import PublishContext, producer_rate_take, publish_authenticate
from jobs.publish.messages import NewMessage, message_publish, messages_publish

logger = logging.getLogger(__name__)
BATCH_MAX = 500  # messages per transaction
WAIT_MAX = 120.0  # seconds a request waits for its commit (the thread's round trips are bounded far below)
TAKEN_WITHIN = 1.0  # seconds a message may wait in the queue before its request publishes it itself
IDLE_CHECK = 1.0  # seconds without a batch after which the connection is checked before the next
CONCURRENT_WITHIN = 1.0  # seconds: the window holds a batch only this soon after two publishes overlapped


@dataclass(eq=False)
class _Item:
    channel_id: str
    channel_token: str | None
    producer_id: str | None
    producer_token: str | None
    message: NewMessage
    done: threading.Event = field(default_factory=threading.Event)
    message_id: str | None = None
    error: BaseException | None = None

    @property
    def credentials(self) -> tuple:
        return self.channel_id, self.channel_token, self.producer_id, self.producer_token


class GroupPublisher:
    """The process's publishing thread and its queue of waiting requests."""

    def __init__(self) -> None:
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._pending = 0  # publishes handed over and not answered yet
        self._overlapped = float("-inf")  # when two publishes were last pending at once
        self.batches = 0  # transactions committed (tests, benchmarks)

    def take_back(self, item: _Item) -> bool:
        """Remove ``item`` if the thread has not taken it yet (True: the caller publishes it)."""
        with self._cond:
            try:
                self._queue.remove(item)
            except ValueError:
                return False
            self._pending -= 1
            return True

    def submit(self, item: _Item) -> None:
        with self._cond:
            self._queue.append(item)
            self._pending += 1
            if self._pending > 1:
                self._overlapped = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="broker-publish", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Close the thread's connection (it reconnects on its next batch) and wait for it: before a
        test database is dropped."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                return
            self._closed.clear()
            self._queue.append(None)
            self._cond.notify()
        self._closed.wait(10)

    def _run(self) -> None:
        last = float("-inf")
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                # a producer publishing one message at a time (never two pending) is not held: only
                # concurrent publishers gather (as PostgreSQL's commit_delay waits only with siblings)
                concurrent = time.monotonic() - self._overlapped < CONCURRENT_WITHIN
                window = float(settings.BROKER_PUBLISH_WINDOW) if concurrent else 0.0
                while (hold := last + window - time.monotonic()) > 0 and len(self._queue) < BATCH_MAX:
                    self._cond.wait(hold)
                batch = [self._queue.popleft() for _ in range(min(BATCH_MAX, len(self._queue)))]
            idle, last = time.monotonic() - last, time.monotonic()
            items = [item for item in batch if item is not None]
            try:
                connection.close_if_unusable_or_obsolete()
                if idle > IDLE_CHECK and connection.connection is not None and not connection.is_usable():
                    connection.close()  # broken while idle (a restart, a failover): the batch reconnects
                if items:
                    self._publish(items)
            except BaseException as exc:  # noqa: BLE001 - every waiting request gets an answer
                logger.exception("grouped publish failed")
                for item in items:
                    if item.message_id is None and item.error is None:
                        item.error = exc
            finally:
                with self._cond:
                    self._pending -= len(items)
                for item in items:
                    item.done.set()
                if len(items) < len(batch):  # close() asked for it
                    connection.close()
                    self._closed.set()

    def _publish(self, items: list[_Item]) -> None:
        groups = self._authenticated(items)
        try:
            # one group (the usual batch): its one statement is its own transaction, without the round
            # trips of BEGIN and COMMIT
            with transaction.atomic() if len(groups) > 1 else nullcontext():
                for ctx, members in groups:
                    results = messages_publish(ctx=ctx, messages=[item.message for item in members])
                    for item, (mid, created) in zip(members, results):
                        item.message_id, item.error = (mid, None) if created else (None, _duplicate())
            self.batches += 1
        except (DomainError, *DB_ERRORS) as exc:
            if len(items) == 1 and not isinstance(exc, DomainError):
                raise
            logger.info("grouped publish of %d messages rolled back (%s); publishing them one by one",
                        len(items), type(exc).__name__)
            for ctx, members in groups:
                for item in members:
                    try:
                        item.message_id, item.error = message_publish(ctx=ctx, message=item.message), None
                    except (DomainError, *DB_ERRORS) as one:
                        item.message_id, item.error = None, one

    @staticmethod
    def _authenticated(items: list[_Item]) -> list[tuple[PublishContext, list[_Item]]]:
        """Each item's channel and producer checked once per set of credentials; a refused item gets
        its error. Returns the rest grouped by context, each rate-limited producer's items having
        taken their tokens one by one (as separate requests would)."""
        contexts: dict[tuple, PublishContext | DomainError] = {}
        groups: dict[tuple, tuple[PublishContext, list[_Item]]] = {}
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
                item.error = ctx
                continue
            if ctx.rate:
                try:
                    producer_rate_take(ctx=ctx, n=1)
                except DomainError as exc:
                    item.error = exc
                    continue
                ctx = dataclasses.replace(ctx, rate=None)  # spent: messages_publish must not take again
            groups.setdefault((ctx.channel_pk, ctx.producer_pk), (ctx, []))[1].append(item)
        return list(groups.values())


def _duplicate() -> Conflict:
    return Conflict("duplicate_message_id", "duplicate message id for channel")


_publisher = GroupPublisher()


def message_publish_grouped(*, channel_id: str, channel_token: str | None, producer_id: str | None,
                            producer_token: str | None, message: NewMessage) -> str:
    """Authenticate and publish one message, sharing the transaction of the publishes that arrive
    with it (see the module docstring); the same answers and errors as ``publish_authenticate`` then
    ``message_publish``. Returns the message id once its commit is durable."""
    item = _Item(channel_id, channel_token, producer_id, producer_token, message)
    if (not settings.BROKER_PUBLISH_GROUP or connection.in_atomic_block or message.partition_key is not None):
        return _publish_here(item)
    _publisher.submit(item)
    if not item.done.wait(TAKEN_WITHIN) and _publisher.take_back(item):  # the thread is stuck: do it here
        return _publish_here(item)
    if not item.done.wait(WAIT_MAX):  # not known whether it was stored: as a lost connection, 503
        raise Unavailable("database_unavailable", "the database is unavailable, retry shortly", retry_after=1)
    if item.error is not None:
        raise item.error
    return item.message_id


def _publish_here(item: _Item) -> str:
    """``item`` published in the request's own thread and transaction (not grouped)."""
    ctx = publish_authenticate(channel_id=item.channel_id, channel_token=item.channel_token,
                               producer_id=item.producer_id, producer_token=item.producer_token)
    return message_publish(ctx=ctx, message=item.message)


def grouped_publisher_close() -> None:
    """Close the publishing thread's connection (tests, before the database is dropped)."""
    _publisher.close()
