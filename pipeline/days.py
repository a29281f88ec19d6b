"""Days of the dataset (UTC days of publication) and when one is finished. Pure rules, no database.

A day is the UTC day of its messages' ``received_at``. It is *finished* when no job of its messages
can change any more (its facts are then written once, ``pipeline.facts``):

- ``settled``: the day is over (by the longest in-flight deadline, so a publish under way at
  midnight has committed) and every job of its messages is DELIVERED or DEAD; or
- ``age``: the day ended longer ago than the longest a job can take: every attempt up to its
  in-flight deadline and, between two attempts, the longest backoff (``jobs.state.retries``: the
  broker's BROKER_CONNECTION_TIMEOUT, BROKER_RATIONAL_DELAY, BROKER_RETRY_BACKOFF and
  BROKER_MAX_RETRY, or a consumer's own connectionTimeout, maxRetry and retryBackoff, the longest
  of all). A job still QUEUED or INFLIGHT then (a paused consumer, a pull consumer far behind, a
  Retry-After longer than the backoff) is counted as pending in the facts; ``--rebuild`` recounts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Iterable

from django.conf import settings

from jobs.state.retries import inflight_timeout, max_retry_for

DAY = timedelta(days=1)
JITTER = 1.1  # jobs.state.retries.backoff_delay adds up to 10 % to a delay
LEDGER_EPOCH = date(2000, 1, 1)  # retention's per-day ledger numbers days from here (broker.counters)


@dataclass(frozen=True)
class RetryPolicy:
    """A consumer's retry settings as stored (None / "": the broker's default)."""

    connection_timeout: float | None = None
    max_retry: int | None = None
    retry_backoff: str = ""


def day_text(day: date) -> str:
    return day.isoformat()


def day_parse(text: str) -> date:
    return date.fromisoformat(text)


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=timezone.utc)


def day_of(moment: datetime) -> date:
    return moment.astimezone(timezone.utc).date()


def days_covering(since: datetime, until: datetime) -> list[date]:
    """Every UTC day holding a moment of [since, until)."""
    if until <= since:
        return []
    first, last = day_of(since), day_of(until - timedelta(microseconds=1))
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def day_ranges(days: Iterable[date]) -> list[tuple[datetime, datetime]]:
    """Whole days as [start, end) ranges, adjacent days merged."""
    ranges: list[list[datetime]] = []
    for day in sorted(set(days)):
        start = day_start(day)
        if ranges and ranges[-1][1] == start:
            ranges[-1][1] = start + DAY
        else:
            ranges.append([start, start + DAY])
    return [(a, b) for a, b in ranges]


def ledger_day(number: int) -> date:
    """The day of a retention ledger entry (days since LEDGER_EPOCH)."""
    return LEDGER_EPOCH + timedelta(days=int(number))


def _backoff_steps(raw: str | None) -> list[float] | None:
    try:
        steps = [float(x) for x in (raw or "").split(",") if x.strip()]
    except ValueError:
        return None
    return steps or None


def backoff_total(retries: int, steps: list[float]) -> float:
    """The sum of ``backoff_delay(r, steps, jitter=False)`` for r = 1..retries, in closed form (a
    maxRetry can be large): the n-th step within the list, beyond it n - k + 1 times the last."""
    k, retries = len(steps), max(int(retries), 0)
    within = min(retries, k - 1)
    total = sum(steps[:within])
    beyond = retries - within  # the retries at n >= k: multiples 1..beyond of the last step
    return total + steps[-1] * beyond * (beyond + 1) / 2


def job_settle_seconds(policy: RetryPolicy) -> float:
    """The longest a job can take from its first claim to its last status change under ``policy``:
    ``max_retry + 1`` attempts each up to its in-flight deadline, and the ``max_retry`` backoffs
    between them with their full jitter."""
    retries = max_retry_for(policy.max_retry)
    steps = _backoff_steps(policy.retry_backoff) or list(settings.BROKER_RETRY_BACKOFF) or [5.0]
    deadline = inflight_timeout(0, policy.connection_timeout)
    return (retries + 1) * deadline + JITTER * backoff_total(retries, steps)


@dataclass(frozen=True)
class FinishRule:
    """``bound``: seconds after its end a day is finished whatever its jobs' states; ``settle``:
    seconds after its end a day whose jobs are all DELIVERED or DEAD is finished."""

    bound: float
    settle: float

    def finished(self, *, day: date, now: datetime, pending_jobs: int) -> str | None:
        """``"age"``, ``"settled"`` or None (not finished: read it live again next time)."""
        end = day_start(day) + DAY
        if end + timedelta(seconds=self.bound) <= now:
            return "age"
        if pending_jobs == 0 and end + timedelta(seconds=self.settle) <= now:
            return "settled"
        return None


def finish_rule_build(policies: Iterable[RetryPolicy]) -> FinishRule:
    """The rule over the broker's defaults and every consumer's own settings (the longest wins)."""
    policies = [RetryPolicy(), *policies]
    return FinishRule(
        bound=max(job_settle_seconds(p) for p in policies),
        settle=max(inflight_timeout(0, p.connection_timeout) for p in policies),
    )
