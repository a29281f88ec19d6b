"""Publishing's admission by the push deliveries' lag (issue 34, "shed, don't drown").

The publishing queue (jobs.publish.grouped) says when *publishing* cannot keep up. A broker offered
more than it delivers can publish all of it and still drown: the deliveries fall further behind
every second (a 6,000/s burst for 60 s: every publish accepted, push 44 s behind, not back for a
minute). So the deliveries' own lag, as the dispatcher engines report it (jobs.push.lag: the
shortest, across consumers, of their longest wait from due to claimed), drives a share of single
publishes refused at once (503 ``overloaded``, Retry-After):

- over ``BROKER_PUBLISH_ADMIT_LAG`` and not shrinking by at least ``CATCHING_UP`` seconds a second
  (taken over ``GROWTH_OVER``): the share rises, by up to ``STEP`` a read as the lag reaches twice
  the bound (twice that while the lag grows faster than real time), at most ``SHARE_MAX``, so the
  accepted rate comes down to what the deliveries take;
- over it and shrinking: the share holds (a broker catching up does not at once take in again what
  put it behind); at or under it, the share eases off slowly (``STEP`` / 10 a read);
- no lag reported (under jobs.push.lag.QUIET everywhere: the broker keeps up): the share falls by
  ``STEP`` a read, to 0;
- over ``BACKLOG``: the same. Such a lag is not a load coming in faster than it goes out (that is
  seen seconds after it begins) but an old backlog being drained: a consumer resumed or an endpoint
  back after an outage with jobs hours old, the only consumer claimed. Its producers keep publishing.

Read by the publishing thread (its connection) at most every ``READ_EVERY`` before a batch; a share
not refreshed for ``STALE`` (no batch: nothing published) counts as 0.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque

from django.conf import settings

from broker.db.errors import DB_ERRORS
from broker.db.run import query_fetchone
from jobs.publish.queries import Q

logger = logging.getLogger(__name__)
READ_EVERY = 0.5  # seconds between two reads of the engines' reports
FRESH = 5.0  # seconds a report counts (an engine reports every jobs.push.lag.PERIOD while it is behind)
STALE = 3.0  # seconds after the last read when the share no longer applies
GROWTH_OVER = 2.0  # seconds the lag's growth is taken over
CATCHING_UP = 0.1  # seconds of lag shed per second: the deliveries are catching up
BACKLOG = 60.0  # seconds: a lag longer than this is an old backlog drained, not a load to shed
STEP = 0.1  # the share's change per read
SHARE_MAX = 0.95  # some publishes always go through (they keep the batches, hence the reads, going)


def shed_share_next(*, share: float, lag: float, growth: float, target: float) -> float:
    """The share of publishes to refuse after a read of ``lag`` (seconds) growing by ``growth``
    seconds per second, with ``share`` refused until now (the module docstring's rules)."""
    if target <= 0:
        return 0.0
    if lag <= 0 or lag > BACKLOG:
        return max(0.0, share - STEP)
    if lag <= target:
        return max(0.0, share - STEP / 10)
    if growth > -CATCHING_UP:
        return min(SHARE_MAX, share + STEP * min(1.0, (lag - target) / target) * (2.0 if growth > 1.0 else 1.0))
    return share


class LagAdmission:
    """One process's share: refreshed by the publishing thread, asked by every single publish."""

    def __init__(self) -> None:
        self.share = 0.0
        self._readings: deque[tuple[float, float]] = deque()
        self._read_at = float("-inf")

    def refresh(self) -> None:
        """(the publishing thread, before a batch) A new share, at most every READ_EVERY."""
        target = float(settings.BROKER_PUBLISH_ADMIT_LAG)
        now = time.monotonic()
        if target <= 0 or now - self._read_at < READ_EVERY:
            return
        self._read_at = now
        try:
            row = query_fetchone(Q.delivery_lag, {"fresh": FRESH})
        except DB_ERRORS:  # the batch that follows meets the same trouble and answers for it
            logger.debug("delivery lag not read", exc_info=True)
            return
        lag = float(row[0] or 0.0) if row else 0.0
        readings = self._readings
        readings.append((now, lag))
        while len(readings) > 1 and now - readings[0][0] > GROWTH_OVER:
            readings.popleft()
        t0, lag0 = readings[0]
        growth = (lag - lag0) / (now - t0) if now > t0 else 0.0
        share = shed_share_next(share=self.share, lag=lag, growth=growth, target=target)
        if share > 0 and self.share == 0:
            logger.warning("push deliveries %.1f s behind (growing %.2f s/s): refusing a share of publishes", lag,
                           growth)
        self.share = share

    def refuse(self) -> bool:
        """Whether to refuse this publish (a random draw against the share, while it is fresh)."""
        share = self.share
        if share <= 0 or time.monotonic() - self._read_at > STALE:
            return False
        return random.random() < share


lag_admission = LagAdmission()
