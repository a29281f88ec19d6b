"""When a day of the dataset is finished (pure rules over the retry settings) and the day
arithmetic of the reads."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from jobs.state.retries import backoff_delay, inflight_timeout
from pipeline.days import (FinishRule, RetryPolicy, backoff_total, day_ranges, days_covering, finish_rule_build,
                           job_settle_seconds, ledger_day)

UTC = timezone.utc


@pytest.mark.parametrize("steps", [[5.0, 30.0, 60.0], [7.0], [1.0, 2.0]])
@pytest.mark.parametrize("retries", [0, 1, 2, 3, 4, 9])
def test_backoff_total_is_the_sum_of_the_delays(steps, retries):
    assert backoff_total(retries, steps) == pytest.approx(
        sum(backoff_delay(r, steps, jitter=False) for r in range(1, retries + 1)))


def test_the_bound_from_the_broker_settings(settings):
    settings.BROKER_CONNECTION_TIMEOUT, settings.BROKER_RATIONAL_DELAY = 30.0, 2.0
    settings.BROKER_RETRY_BACKOFF, settings.BROKER_MAX_RETRY = [5.0, 30.0, 60.0], 5
    # 6 attempts of 32.25 s each, and 5 backoffs (5 + 30 + 60 + 120 + 180) with their 10 % jitter
    assert job_settle_seconds(RetryPolicy()) == pytest.approx(6 * 32.25 + 1.1 * 395)
    assert job_settle_seconds(RetryPolicy(connection_timeout=2.0, max_retry=0)) == pytest.approx(4.25)
    assert job_settle_seconds(RetryPolicy(max_retry=2, retry_backoff="10")) == pytest.approx(3 * 32.25 + 1.1 * 30)
    assert job_settle_seconds(RetryPolicy(retry_backoff="not,numbers")) == job_settle_seconds(RetryPolicy())
    # a huge maxRetry is summed in closed form, not looped
    assert job_settle_seconds(RetryPolicy(max_retry=2**31 - 1)) > 1e20


def test_the_longest_consumer_sets_the_bound(settings):
    settings.BROKER_MAX_RETRY = 5
    base = finish_rule_build([])
    slow = finish_rule_build([RetryPolicy(), RetryPolicy(connection_timeout=120.0, max_retry=10)])
    assert slow.bound == job_settle_seconds(RetryPolicy(connection_timeout=120.0, max_retry=10)) > base.bound
    assert slow.settle == inflight_timeout(0, 120.0) > base.settle == inflight_timeout(0, None)


def test_a_day_is_finished_by_age_or_once_its_jobs_are_settled():
    rule = FinishRule(bound=600.0, settle=30.0)
    day = date(2026, 3, 1)
    end = datetime(2026, 3, 2, tzinfo=UTC)
    assert rule.finished(day=day, now=end - timedelta(hours=1), pending_jobs=0) is None  # not over yet
    assert rule.finished(day=day, now=end + timedelta(seconds=10), pending_jobs=0) is None  # a publish may commit
    assert rule.finished(day=day, now=end + timedelta(seconds=30), pending_jobs=0) == "settled"
    assert rule.finished(day=day, now=end + timedelta(seconds=599), pending_jobs=3) is None
    assert rule.finished(day=day, now=end + timedelta(seconds=600), pending_jobs=3) == "age"


def test_days_and_ranges():
    since, until = datetime(2026, 3, 1, 13, tzinfo=UTC), datetime(2026, 3, 4, tzinfo=UTC)
    assert days_covering(since, until) == [date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)]
    assert days_covering(until, since) == []
    assert day_ranges([date(2026, 3, 3), date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 5)]) == [
        (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 4, tzinfo=UTC)),
        (datetime(2026, 3, 5, tzinfo=UTC), datetime(2026, 3, 6, tzinfo=UTC))]
    assert ledger_day(0) == date(2000, 1, 1) and ledger_day(9556) == date(2026, 3, 1)
