"""``PullConsumer.consume``: the loop that pulls, runs the handler, and settles jobs.

- Long-polls (``expires``) only when it holds no job; with jobs in hand it tops up without waiting.
- Outcomes are buffered and sent in one ack per batch: before every pull, when ``batch`` are
  waiting, and at the latest ``ack_interval`` seconds after the oldest (a keeper thread sends them
  while a slow handler runs).
- The keeper thread also sends progress for every held job past half of its lease, so a slow
  handler (or a job waiting its turn) is not taken back and given to another consumer.
- On ``stop()`` or SIGTERM it stops pulling (SIGTERM abandons a long-poll in progress: a job the
  broker claims for that abandoned poll in its last moments comes back after its deadline, as after
  any crash), runs the jobs in hand, sends every outcome and returns.

The loop knows its consumer only by the calls it makes (``pull_send``, ``ack_send``,
``progress_send``, ``stopping``): ``consumer.py`` imports this module, never the other way round.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable

from broker_client.errors import BrokerError
from broker_client.http import RetryPolicy, is_transient
from broker_client.jobs import DEAD, DELIVERED, QUEUED, Job, answer_error

logger = logging.getLogger("broker_client")

DEFAULT_BACKOFF = (1.0, 5.0, 30.0, 60.0)  # nack delay by attempt: 1st failure 1 s, 2nd 5 s, ...
KEEPER_TICK = 0.1
PROGRESS_RETRY = RetryPolicy(attempts=1, max_wait=1.0, backoff=0.2)
IDLE_REPOLL = 0.5  # with jobs in hand, an empty top-up pull is repeated at most this often


class Retry(Exception):
    """Raise from a handler to nack the job with this ``delay`` (seconds) instead of the backoff."""

    def __init__(self, delay: float = 0.0, reason: str = ""):
        super().__init__(reason or f"retry in {delay} s")
        self.delay = delay


class Reject(Exception):
    """Raise from a handler to make the job DEAD at once (no retries: it can never succeed)."""


class _Interrupted(BaseException):
    """Raised by the SIGTERM handler inside a long-poll, to abandon it at once."""


@dataclass
class ConsumeStats:
    pulls: int = 0
    received: int = 0
    delivered: int = 0
    nacked: int = 0
    dead: int = 0
    failed: int = 0  # handler raised (then nacked or dead)
    conflicts: int = 0  # outcomes the broker refused: the job was no longer ours
    lost: int = 0  # jobs taken back before they were handled (skipped)
    progress: int = 0  # deadline extensions sent


@dataclass(eq=False)
class ConsumeLoop:
    """One run of ``consume``. Options: ``nack_backoff`` (delays by attempt, or a function
    ``(job, exc) -> seconds``), ``ack_interval`` (longest wait of an outcome before it is sent),
    ``max_bytes`` (payload budget per pull), ``signals`` (default SIGTERM; () for none)."""

    consumer: Any
    handler: Callable
    _: KW_ONLY
    batch: int = 100
    expires: float = 30.0
    concurrency: int = 1
    nack_backoff: Any = DEFAULT_BACKOFF
    ack_interval: float = 1.0
    max_bytes: int | None = None
    signals: tuple = (signal.SIGTERM,)
    # the run's state
    stats: ConsumeStats = field(default_factory=ConsumeStats, init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    held: dict[str, Job] = field(default_factory=dict, init=False)  # claimed, not yet reported to the broker
    outcomes: list[tuple[Job, dict, float]] = field(default_factory=list, init=False)  # (job, ack item, when decided)
    polling: bool = field(default=False, init=False)
    error: BaseException | None = field(default=None, init=False)
    keeper_stop: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= 1000:
            raise ValueError("batch must be 1..1000")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.stopping = self.consumer.stopping

    # --- the run ---------------------------------------------------------------------------------

    def run(self) -> ConsumeStats:
        self.stopping.clear()
        previous = self.signals_install()
        keeper = threading.Thread(target=self.keeper_run, name="broker-client-keeper", daemon=True)
        keeper.start()
        try:
            if self.concurrency == 1:
                self.loop_inline()
            else:
                self.loop_pool()
        finally:
            self.keeper_stop.set()
            keeper.join()
            self.outcomes_flush()
            self.signals_restore(previous)
        if self.error is not None:
            raise self.error
        return self.stats

    def loop_inline(self) -> None:
        """concurrency 1: pull, run each job in this thread, ack the batch, pull again."""
        while not self.stopping.is_set():
            self.outcomes_flush()
            for job in self.pull(self.batch, self.expires):
                self.job_run(job)

    def loop_pool(self) -> None:
        """concurrency N: N handler threads; top up to ``batch`` jobs in hand when half are done."""
        futures: set = set()
        last_empty = 0.0
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="broker-client-handler") as pool:
            while not self.stopping.is_set():
                futures = {f for f in futures if not f.done()}
                if len(self.outcomes) >= self.batch:
                    self.outcomes_flush()
                room = self.batch - len(futures)
                if not futures:
                    self.outcomes_flush()
                    jobs = self.pull(self.batch, self.expires)
                elif room >= max(1, self.batch // 2) and time.monotonic() - last_empty >= IDLE_REPOLL:
                    jobs = self.pull(room, 0)
                    if not jobs:
                        last_empty = time.monotonic()
                else:
                    futures_wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
                    continue
                futures |= {pool.submit(self.job_run, job) for job in jobs}
            futures_wait(futures)

    # --- pulling ---------------------------------------------------------------------------------

    def pull(self, batch: int, expires: float) -> list[Job]:
        """One pull; a transient failure (broker or database down) is logged and retried later,
        a permanent one (tokens, consumer gone) stops the loop after the jobs in hand."""
        if self.stopping.is_set():
            return []
        self.polling = True
        try:
            jobs = self.consumer.pull_send(batch=batch, expires=expires, no_wait=expires <= 0,
                                           max_bytes=self.max_bytes, wait=self.stopping.wait)
        except _Interrupted:
            return []
        except BaseException as exc:
            self.polling = False
            if is_transient(exc):
                logger.warning("pull failed, trying again: %r", exc)
                self.stopping.wait(1.0)
            else:
                self.error = exc
                self.stopping.set()
            return []
        finally:
            self.polling = False
        self.stats.pulls += 1
        self.stats.received += len(jobs)
        with self.lock:
            for job in jobs:
                self.held[job.id] = job
        return jobs

    # --- one job ---------------------------------------------------------------------------------

    def job_run(self, job: Job) -> None:
        if job.lost:
            with self.lock:
                self.held.pop(job.id, None)
                self.stats.lost += 1
            return
        try:
            self.handler(job)
        except Reject as exc:
            self.failed_count()
            logger.warning("job %s rejected: %s", job.id, exc)
            self.outcome_add(job, DEAD)
        except Exception as exc:  # noqa: BLE001 - any handler failure is a nack
            self.failed_count()
            delay = exc.delay if isinstance(exc, Retry) else self.backoff(job, exc)
            logger.warning("handler failed on job %s (attempt %s), retry in %s s: %r", job.id, job.attempt,
                           delay, exc, exc_info=not isinstance(exc, Retry))
            self.outcome_add(job, QUEUED, delay)
        else:
            self.outcome_add(job, DELIVERED)

    def failed_count(self) -> None:
        with self.lock:
            self.stats.failed += 1

    def backoff(self, job: Job, exc: BaseException) -> float:
        if callable(self.nack_backoff):
            return float(self.nack_backoff(job, exc))
        steps = self.nack_backoff or (0.0,)
        return float(steps[min(max((job.attempt or 1) - 1, 0), len(steps) - 1)])

    def outcome_add(self, job: Job, state: str, delay: float | None = None) -> None:
        """Buffer the outcome (unless the handler settled the job itself)."""
        if not job.settle_mark():
            with self.lock:
                self.held.pop(job.id, None)
            return
        item = {"ID": job.id, "NextState": state}
        if job.receipt is not None:
            item["Receipt"] = job.receipt
        if state == QUEUED and delay:
            item["Delay"] = delay
        with self.lock:
            self.outcomes.append((job, item, time.monotonic()))

    def outcomes_flush(self) -> None:
        """Send every buffered outcome in one ack (per 1,000). Retried on transient failures, also
        while stopping; what still fails is logged (those jobs come back after their deadline)."""
        with self.lock:
            batch, self.outcomes = self.outcomes, []
        if not batch:
            return
        items = [item for _, item, _ in batch]
        try:
            answers, retried = self.consumer.ack_send(items)
        except BaseException as exc:  # noqa: BLE001 - never lose the loop over an ack
            logger.error("ack of %d jobs failed, they come back after their deadline: %r", len(items), exc)
            answers, retried = [], False
        by_id = {str(a.get("ID")): a for a in answers}
        with self.lock:
            for job, item, _ in batch:
                self.held.pop(job.id, None)
                answer = by_id.get(job.id)
                if answer is None:
                    continue
                if answer_error(answer, item["NextState"], retried) is not None:
                    self.stats.conflicts += 1
                    logger.warning("outcome %s of job %s refused: %s (now %s)", item["NextState"], job.id,
                                   answer.get("Error"), answer.get("Status"))
                elif item["NextState"] == DELIVERED:
                    self.stats.delivered += 1
                elif item["NextState"] == DEAD or answer.get("Status") == DEAD:
                    self.stats.dead += 1
                else:
                    self.stats.nacked += 1

    # --- the keeper: progress and late acks ------------------------------------------------------

    def keeper_run(self) -> None:
        while not self.keeper_stop.wait(KEEPER_TICK):
            now = time.monotonic()
            with self.lock:
                due = [j for j in self.held.values() if not j.settled and not j.lost and j.progress_due(now)]
                oldest = self.outcomes[0][2] if self.outcomes else None
                late = any(job.progress_due(now) for job, _, _ in self.outcomes)
            for job in due:
                try:
                    self.consumer.progress_send(job=job, retry=PROGRESS_RETRY)
                    self.stats.progress += 1
                except BrokerError as exc:
                    if job.lost:
                        logger.warning("job %s was taken back before it was done: %s", job.id, exc.code)
                    else:
                        logger.warning("progress of job %s failed: %r", job.id, exc)
                except Exception as exc:  # noqa: BLE001 - the keeper never dies; tried again next tick
                    logger.warning("progress of job %s failed: %r", job.id, exc)
            if late or (oldest is not None and now - oldest >= self.ack_interval):
                self.outcomes_flush()

    # --- signals ---------------------------------------------------------------------------------

    def signals_install(self) -> dict:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in self.signals:
            previous[sig] = signal.signal(sig, self.signal_handle)
        return previous

    def signals_restore(self, previous: dict) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def signal_handle(self, signum, frame) -> None:
        logger.info("signal %s: stopping after the jobs in hand", signum)
        self.stopping.set()
        if self.polling:
            self.polling = False
            raise _Interrupted()
