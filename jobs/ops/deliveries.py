"""A consumer's delivery attempts as its team reads them (the delivery portal): pages of the latest
attempts, newest first, and the figures of the last hour and day.

``jobs_deliveryattempt`` has no consumer column (one row per push attempt, the biggest table after
the jobs); it is read backwards by primary key over a bounded window of ids, each row's job looked
up by its primary key. So a page or the figures cost the same whatever the table's size, and say
how far back they reached when the window did not hold all that was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from broker.db.run import query_fetchall, query_fetchone
from jobs.ops.queries import Q

PAGE_SCAN = 50_000  # attempt ids one page of a consumer's attempts reads at most
FIGURES_SCAN = 50_000  # attempt ids the hour and day figures are read from
HEAD = 300  # characters of an error or of the response's head shown per attempt
OUTCOMES = ("delivered", "failed", "timeout", "error", "gone")  # jobs.push.delivery.Result.outcome


@dataclass(frozen=True)
class Attempt:
    id: int
    job_id: int
    attempt: int
    started_at: datetime
    duration_ms: float | None
    status_code: int | None
    outcome: str
    error: str
    response_head: str


@dataclass(frozen=True)
class AttemptPage:
    """``attempts`` newest first; ``older``: where the next page starts (``before``), None at the
    table's start; ``reached``: the lowest id this page read (below it nothing was looked at)."""

    attempts: list[Attempt]
    older: int | None
    reached: int


def consumer_attempts(*, consumer_pk: int, before: int | None = None, outcome: str | None = None,
                      limit: int = 25, scan: int = PAGE_SCAN) -> AttemptPage:
    """The consumer's attempts with ids below ``before`` (None: from the newest), newest first,
    at most ``limit``, found among at most ``scan`` attempt ids; ``outcome`` one of OUTCOMES."""
    if outcome is not None and outcome not in OUTCOMES:
        raise ValueError(outcome)
    high = before if before is not None else int(query_fetchone(Q.attempts_newest_id)[0]) + 1
    low = max(high - scan, 0)
    rows = query_fetchall(Q.consumer_attempts, {"consumer": consumer_pk, "low": low, "high": high,
                                                 "outcome": outcome, "limit": limit + 1, "head": HEAD})
    attempts = [Attempt(*row) for row in rows[:limit]]
    if len(rows) > limit:
        older = attempts[-1].id  # a full page: the next one starts below its last row
    else:
        older = low if low > 0 else None  # the window ran out first: go on below it
    return AttemptPage(attempts=attempts, older=older, reached=low)


@dataclass(frozen=True)
class Window:
    attempts: int
    delivered: int
    p50_ms: float | None
    p99_ms: float | None

    @property
    def failed(self) -> int:
        return self.attempts - self.delivered

    @property
    def success_rate(self) -> float | None:
        return self.delivered / self.attempts if self.attempts else None


@dataclass(frozen=True)
class AttemptFigures:
    """The last hour and day; ``reach``: when set, the figures cover only the attempts since then
    (the day held more attempts of the broker than FIGURES_SCAN)."""

    hour: Window
    day: Window
    reach: datetime | None


def consumer_attempt_figures(*, consumer_pk: int, scan: int = FIGURES_SCAN) -> AttemptFigures:
    """Attempts, deliveries, success rate and p50 / p99 callback duration of the last hour and day."""
    row = query_fetchone(Q.consumer_attempt_figures, {"consumer": consumer_pk, "scan": scan})
    return AttemptFigures(hour=Window(*row[0:4]), day=Window(*row[4:8]), reach=row[8])
