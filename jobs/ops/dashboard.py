"""What the operator's dashboard (and ``manage.py broker_stats``) shows: per channel and consumer,
jobs by status, the oldest queued job, deliveries and failures per minute over the last hour, the
backlog trend, and alerts.

Every number comes from maintained data or a bounded index query, never from ``COUNT(*)`` over a
big table, so a page costs the same with a thousand jobs or a hundred million:
- jobs by status: the maintained counters (``broker.counters``);
- per-minute figures: ``jobs_minutestat``, kept by triggers on ``jobs_job``
  (jobs/migrations/0011_dashboard_minute_stats.py): at most 60 rows per consumer and connection;
- oldest queued job: one index probe per consumer (``job_claim``: QUEUED jobs by consumer and id);
- overdue in-flight jobs: the partial index on in-flight deadlines, capped;
- the footprint (retention): each channel's oldest stored message (one probe of
  ``message_channel_received``), the rows retention removed (counters) and its last run (one row).

Alerts are rules over a consumer's figures (``alert_rule``); features that land later (flow
control: "consumer paused"; priority groups: "pin changing often") add their rule here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterable

from django.db import connection

from broker.counters import JOB, MESSAGE, REDELIVERED, counts_for
from broker.models import Channel
from broker.times import db_now
from consumers.models import Consumer
from jobs.ops.queries import Q
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.sweeps.retention import LastRun, oldest_messages, removed_by_channel, retention_last_run, retention_seconds

MINUTES = 60  # the charts' window
RATE_MINUTES = 5  # the "delivered / min" figures: the charts' last five bars
SCHEDULED_SCOPE = 3  # broker_counter scope of scheduled messages (broker/migrations/0002)
SCHEDULED = 101
# Alert thresholds (kept here, next to the rules that use them).
GROWTH_WINDOW = 10  # minutes
GROWTH_MIN = 10  # jobs: smaller growth is noise
GROWTH_SHARE = 0.10  # of the jobs created in the window
STALL_AGE = 300.0  # seconds: oldest queued job older than this while nothing is delivered ...
STALL_WINDOW = 5  # ... in this many minutes
FAILURE_WINDOW = 10  # minutes
FAILURE_MIN_ATTEMPTS = 5
FAILURE_WARN = 0.10
FAILURE_ERROR = 0.50
OVERDUE_GRACE = 60  # seconds past an in-flight deadline before the timeout sweep counts as late
OVERDUE_CAP = 1000


@dataclass
class Alert:
    level: str  # "error" | "warning"
    kind: str  # "dead", "backlog", "stalled", "failing", "overdue", "paused", "backlog-full", "pin-churn"
    text: str
    consumer_pk: int | None = None


@dataclass
class Series:
    """Per-minute figures, oldest first; the last element is the current (partial) minute."""

    created: list[int] = field(default_factory=lambda: [0] * MINUTES)
    delivered: list[int] = field(default_factory=lambda: [0] * MINUTES)
    retried: list[int] = field(default_factory=lambda: [0] * MINUTES)
    dead: list[int] = field(default_factory=lambda: [0] * MINUTES)
    requeued: list[int] = field(default_factory=lambda: [0] * MINUTES)

    @property
    def failed(self) -> list[int]:
        """Attempts that ended without a delivery (retried later, or dead)."""
        return [r + d for r, d in zip(self.retried, self.dead, strict=True)]

    def add(self, other: Series) -> None:
        for name in ("created", "delivered", "retried", "dead", "requeued"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for i in range(MINUTES):
                mine[i] += theirs[i]

    def last(self, name: str, minutes: int, *, complete: bool = False) -> int:
        """Sum of ``name`` over the last ``minutes`` minutes (``complete``: without the current one)."""
        values = self.failed if name == "failed" else getattr(self, name)
        end = MINUTES - 1 if complete else MINUTES
        return sum(values[end - minutes:end])

    def per_minute(self, name: str, minutes: int, elapsed: float) -> float:
        """``name`` per minute over the chart's last ``minutes`` bars, the current (partial) one
        included: their sum over the time they cover (``elapsed``: seconds into the current
        minute). The figure and the chart read the same bars, so a delivery drawn in the chart is
        never missing from the figure."""
        return self.last(name, minutes) / (minutes - 1 + min(max(elapsed, 1.0), 60.0) / 60.0)

    def backlog(self, now_value: int) -> list[int]:
        """Queued + in-flight jobs at the end of each minute, rebuilt backwards from the current
        value: each minute adds its created and requeued jobs and removes the delivered and dead."""
        values = [0] * MINUTES
        value = now_value
        for i in range(MINUTES - 1, -1, -1):
            values[i] = max(value, 0)
            value -= self.created[i] + self.requeued[i] - self.delivered[i] - self.dead[i]
        return values


@dataclass
class ConsumerStats:
    consumer: object  # consumers.models.Consumer (channel selected)
    queued: int = 0
    inflight: int = 0
    delivered: int = 0
    dead: int = 0
    redelivered: int = 0
    oldest_queued_age: float | None = None  # seconds
    pin_changes: int = 0  # priority-group pins taken in the last hour
    series: Series = field(default_factory=Series)
    alerts: list[Alert] = field(default_factory=list)
    minute_elapsed: float = 60.0  # seconds into the current minute (database clock)

    @property
    def backlog_now(self) -> int:
        return self.queued + self.inflight

    @property
    def delivered_per_minute(self) -> float:
        """Deliveries per minute over the chart's last RATE_MINUTES bars (``Series.per_minute``)."""
        return self.series.per_minute("delivered", RATE_MINUTES, self.minute_elapsed)

    @property
    def attempts_hour(self) -> int:
        return sum(self.series.delivered) + sum(self.series.failed)

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts / attempts over the last hour (None without attempts)."""
        attempts = self.attempts_hour
        return sum(self.series.failed) / attempts if attempts else None

    @property
    def backlog_growth(self) -> int:
        """Change of queued + in-flight jobs over the last GROWTH_WINDOW minutes."""
        s, n = self.series, GROWTH_WINDOW
        return s.last("created", n) + s.last("requeued", n) - s.last("delivered", n) - s.last("dead", n)


@dataclass
class ChannelStats:
    channel: object  # broker.models.Channel
    consumers: list[ConsumerStats] = field(default_factory=list)
    messages: int = 0
    scheduled: int = 0
    series: Series = field(default_factory=Series)
    retention: int = 0  # seconds: the retention in force
    oldest_message_age: float | None = None  # seconds; None: no message stored
    removed: dict = field(default_factory=dict)  # rows removed by retention, by table

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.consumers)

    @property
    def removed_rows(self) -> int:
        return sum(self.removed.values())

    @property
    def alerts(self) -> list[Alert]:
        return [a for c in self.consumers for a in c.alerts]

    @property
    def failure_rate(self) -> float | None:
        attempts = sum(self.series.delivered) + sum(self.series.failed)
        return sum(self.series.failed) / attempts if attempts else None


@dataclass
class Dashboard:
    now: datetime
    channels: list[ChannelStats]
    alerts: list[Alert]  # every alert, errors first
    series: Series  # all consumers
    overdue_inflight: int = 0
    retention_last_run: LastRun | None = None

    @property
    def removed(self) -> dict:
        """Rows removed by retention, by table, over every channel shown."""
        total: dict = {}
        for ch in self.channels:
            for table, n in ch.removed.items():
                total[table] = total.get(table, 0) + n
        return total

    @property
    def consumers(self) -> list[ConsumerStats]:
        return [c for ch in self.channels for c in ch.consumers]

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.consumers)

    @property
    def failure_rate(self) -> float | None:
        attempts = sum(self.series.delivered) + sum(self.series.failed)
        return sum(self.series.failed) / attempts if attempts else None


AlertRule = Callable[[ConsumerStats], Iterable[Alert]]
ALERT_RULES: list[AlertRule] = []


def alert_rule(rule: AlertRule) -> AlertRule:
    """Register a rule: given a consumer's figures, yield its alerts."""
    ALERT_RULES.append(rule)
    return rule


@alert_rule
def dead_jobs_present(s: ConsumerStats):
    if s.dead:
        yield Alert("error", "dead", f"{s.dead:,} dead job{'s' if s.dead != 1 else ''}")


@alert_rule
def backlog_growing(s: ConsumerStats):
    growth = s.backlog_growth
    created = s.series.last("created", GROWTH_WINDOW)
    if s.queued and growth >= GROWTH_MIN and growth >= GROWTH_SHARE * created:
        yield Alert("warning", "backlog", f"backlog grew by {growth:,} in {GROWTH_WINDOW} min")


@alert_rule
def backlog_stalled(s: ConsumerStats):
    if (s.queued and s.oldest_queued_age is not None and s.oldest_queued_age > STALL_AGE
            and s.series.last("delivered", STALL_WINDOW) == 0):
        yield Alert("error", "stalled", f"{s.queued:,} queued, oldest {duration_text(s.oldest_queued_age)}, "
                                        f"nothing delivered in {STALL_WINDOW} min")


@alert_rule
def failing(s: ConsumerStats):
    failed = s.series.last("failed", FAILURE_WINDOW)
    attempts = failed + s.series.last("delivered", FAILURE_WINDOW)
    if attempts >= FAILURE_MIN_ATTEMPTS and failed / attempts >= FAILURE_WARN:
        level = "error" if failed / attempts >= FAILURE_ERROR else "warning"
        yield Alert(level, "failing", f"{failed / attempts:.0%} of {attempts:,} attempts failed "
                                      f"in {FAILURE_WINDOW} min")


@alert_rule
def consumer_paused(s: ConsumerStats):
    """Flow control: a paused consumer gets nothing while its jobs accumulate."""
    if getattr(s.consumer, "paused", False):
        yield Alert("warning", "paused", f"consumer paused ({s.queued:,} queued)")


@alert_rule
def backlog_cap_reached(s: ConsumerStats):
    """Flow control: publishing to the channel is refused (429 backlog_full) at the cap."""
    cap = getattr(s.consumer, "max_queued", None)
    if cap and s.queued >= cap:
        yield Alert("error", "backlog-full", f"backlog cap reached ({s.queued:,} of {cap:,} queued)")


PIN_CHURN = 4  # pins taken in the last hour before "pin changing often" is raised


@alert_rule
def pin_churn(s: ConsumerStats):
    """Priority groups: a pinned client that keeps losing its pin (timeouts, flapping clients)."""
    if s.pin_changes >= PIN_CHURN:
        yield Alert("warning", "pin-churn", f"pin changing often ({s.pin_changes} pins in the last hour)")


def minute_series(*, consumer_pks: list[int]) -> dict[int, Series]:
    """{consumer pk: Series} of the last hour, from ``jobs_minutestat``."""
    result: dict[int, Series] = {}
    if not consumer_pks:
        return result
    with connection.cursor() as cur:
        cur.execute(Q.minute_stats_prune.sql)
        cur.execute(Q.minute_stats.sql, {"window": MINUTES, "ids": consumer_pks})
        for pk, ago, created, delivered, retried, dead, requeued in cur.fetchall():
            if not 0 <= ago < MINUTES:
                continue
            s = result.setdefault(pk, Series())
            i = MINUTES - 1 - ago
            s.created[i], s.delivered[i], s.retried[i] = int(created), int(delivered), int(retried)
            s.dead[i], s.requeued[i] = int(dead), int(requeued)
    return result


def pin_changes(*, consumer_pks: list[int]) -> dict[int, int]:
    """{consumer pk: pins taken in the last hour}, from the advisories (bounded by the
    ``advisory_consumer`` index and the hour)."""
    if not consumer_pks:
        return {}
    with connection.cursor() as cur:
        cur.execute(Q.pin_changes.sql, {"ids": consumer_pks})
        return {pk: int(n) for pk, n in cur.fetchall()}


def oldest_queued_ages(*, consumer_pks: list[int]) -> dict[int, float | None]:
    """Seconds since the oldest QUEUED job of each consumer was created (None: nothing queued).
    One probe of ``job_claim`` (QUEUED jobs by consumer and id) per consumer: the lowest id is the oldest job."""
    if not consumer_pks:
        return {}
    with connection.cursor() as cur:
        cur.execute(Q.oldest_queued.sql, {"ids": consumer_pks})
        return {pk: (float(age) if age is not None else None) for pk, age in cur.fetchall()}


def overdue_inflight_count() -> int:
    """In-flight jobs past their deadline by more than OVERDUE_GRACE (capped): the timeout sweep
    moves them within seconds, so any number here means the sweep is not running."""
    with connection.cursor() as cur:
        cur.execute(Q.overdue_inflight.sql, {"grace": OVERDUE_GRACE, "cap": OVERDUE_CAP})
        return int(cur.fetchone()[0])


def dashboard_snapshot(*, channel_pks: list[int] | None = None) -> Dashboard:
    """Everything the dashboard shows, for every channel (or the given ones)."""
    channels_qs = Channel.objects.order_by("channel_id")
    consumers_qs = Consumer.objects.select_related("channel").order_by("consumer_id")
    if channel_pks is not None:
        channels_qs = channels_qs.filter(pk__in=channel_pks)
        consumers_qs = consumers_qs.filter(channel_id__in=channel_pks)
    channels = {ch.pk: ChannelStats(channel=ch) for ch in channels_qs}
    consumers = list(consumers_qs)
    pks = [c.pk for c in consumers]
    now = db_now()

    job_counts = counts_for(scope=JOB, owner_ids=pks)
    series = minute_series(consumer_pks=pks)
    oldest = oldest_queued_ages(consumer_pks=pks)
    pins = pin_changes(consumer_pks=pks)
    message_counts = counts_for(scope=MESSAGE, owner_ids=list(channels))
    scheduled_counts = counts_for(scope=SCHEDULED_SCOPE, owner_ids=list(channels))

    total = Series()
    for consumer in consumers:
        counts = job_counts.get(consumer.pk, {})
        stats = ConsumerStats(
            consumer=consumer, queued=counts.get(QUEUED, 0), inflight=counts.get(INFLIGHT, 0),
            delivered=counts.get(DELIVERED, 0), dead=counts.get(DEAD, 0),
            redelivered=counts.get(REDELIVERED, 0), oldest_queued_age=oldest.get(consumer.pk),
            pin_changes=pins.get(consumer.pk, 0), series=series.get(consumer.pk) or Series(),
            minute_elapsed=now.second + now.microsecond / 1e6,
        )
        for rule in ALERT_RULES:
            for alert in rule(stats):
                alert.consumer_pk = consumer.pk
                stats.alerts.append(alert)
        channel = channels.get(consumer.channel_id)
        if channel is not None:
            channel.consumers.append(stats)
            channel.series.add(stats.series)
        total.add(stats.series)
    oldest = oldest_messages(channel_pks=list(channels))
    removed = removed_by_channel(list(channels))
    for pk, channel in channels.items():
        channel.messages = sum(message_counts.get(pk, {}).values())
        channel.scheduled = scheduled_counts.get(pk, {}).get(SCHEDULED, 0)
        channel.retention = retention_seconds(channel.channel)
        channel.oldest_message_age = oldest[pk].age if pk in oldest else None
        channel.removed = removed.get(pk, {})

    alerts: list[Alert] = []
    overdue = overdue_inflight_count()
    if overdue:
        alerts.append(Alert("error", "overdue", f"{overdue:,}{'+' if overdue >= OVERDUE_CAP else ''} in-flight "
                            f"jobs are past their deadline by over {OVERDUE_GRACE} s: is the timeout sweep "
                            f"(qcluster) running?"))
    for channel in channels.values():
        alerts.extend(channel.alerts)
    alerts.sort(key=lambda a: a.level != "error")
    return Dashboard(now=now, channels=list(channels.values()), alerts=alerts, series=total,
                     overdue_inflight=overdue, retention_last_run=retention_last_run())


def duration_text(seconds: float | None) -> str:
    """A short human duration: 45 s, 12 min, 3.5 h, 2.1 d."""
    if seconds is None:
        return "-"
    seconds = max(float(seconds), 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
