"""Delivery metrics kept in the maintained counters (scope ``DELIVERY``, owner = consumer pk), so
``/metrics`` reads a few bounded rows at scrape time, whatever the number of web processes and
worker clusters, and never scans the attempt or job tables.

Written by statement-level triggers (jobs migration 0014): one signed-delta insert per statement
into ``broker_counterdelta``, folded by ``counters_compact`` like the job counts. Codes:

- ``OUTCOME_CODES``: push attempts by class of answer (2xx ... 5xx, error = no answer, timeout);
- ``ATTEMPT_BUCKET + i``: push attempts whose round trip fell in bucket i (``ATTEMPT_BOUNDS``,
  i = len: +Inf), ``ATTEMPT_SUM``: their total duration in microseconds;
- ``LATENCY_BUCKET + i`` / ``LATENCY_SUM``: the same for delivery latency, publish (job creation)
  to DELIVERED, for push and pull consumers.

The bucket bounds are also in the migration's SQL: change both together (a new migration).
"""

from __future__ import annotations

DELIVERY = 4  # broker_counter scope (1 jobs, 2 messages, 3 scheduled messages)
OUTCOME_CODES = {1: "2xx", 2: "3xx", 3: "4xx", 4: "5xx", 5: "error", 6: "timeout"}
ATTEMPT_BUCKET, ATTEMPT_SUM = 100, 199
LATENCY_BUCKET, LATENCY_SUM = 200, 299
ATTEMPT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds
LATENCY_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


def histogram(counts: dict, *, base: int, sum_code: int, bounds: tuple) -> tuple[list, float]:
    """Prometheus buckets [(le, cumulative count)] ending with +Inf, and the sum in seconds."""
    buckets, total = [], 0
    for i, bound in enumerate(bounds):
        total += counts.get(base + i, 0)
        buckets.append((_le(bound), total))
    total += counts.get(base + len(bounds), 0)
    buckets.append(("+Inf", total))
    return buckets, counts.get(sum_code, 0) / 1e6


def _le(bound: float) -> str:
    return repr(float(bound))

