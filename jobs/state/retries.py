"""Retry timing, as webhook-broker computes it: the in-flight deadline of a claimed job and the
backoff before a failed attempt's retry. Pure rules over settings (no database).
"""

from __future__ import annotations

import random
from typing import Sequence

from django.conf import settings


def stop_timeout(connection_timeout: float | None = None) -> float:
    """webhook-broker's stopTimeout: the connection timeout plus 250 ms."""
    timeout = settings.BROKER_CONNECTION_TIMEOUT if connection_timeout is None else connection_timeout
    return float(timeout) + 0.25


def inflight_timeout(incremental_timeout: float = 0.0, connection_timeout: float | None = None) -> float:
    """Seconds a claimed job may stay INFLIGHT: stopTimeout + rationalDelay + IncrementalTimeout."""
    return stop_timeout(connection_timeout) + float(settings.BROKER_RATIONAL_DELAY) + float(incremental_timeout or 0)


def backoff_delay(retry: int, steps: Sequence[float] | None = None, *, jitter: bool = True) -> float:
    """Delay before attempt ``retry`` + 1 (retry >= 1), as webhook-broker computes it.

    Within the list the n-th step is used; beyond it steps grow linearly by the last value
    (5,30,60 -> 5, 30, 60, 120, 180, ...). Up to 10% jitter spreads the retries of one outage.
    """
    steps = list(steps or settings.BROKER_RETRY_BACKOFF) or [5.0]
    n = max(int(retry), 1)
    k = len(steps)
    delay = steps[n - 1] if n < k else (n - k + 1) * steps[-1]
    if jitter and delay > 0:
        delay += random.uniform(0, delay * 0.1)
    return float(delay)


def max_retry_for(consumer_max_retry: int | None) -> int:
    return settings.BROKER_MAX_RETRY if consumer_max_retry is None else int(consumer_max_retry)
