"""Publishing's admission by the push deliveries' lag (issue 34, "shed, don't drown").

The publishing queue (jobs.publish.grouped) says when *publishing* cannot keep up. A broker offered
more than it delivers can publish all of it and still drown: the deliveries fall further behind
every second (a 6,000/s burst for 60 s: every publish accepted, push 44 s behind, not back for a
minute). So the deliveries' own lag, as the dispatcher engines report it (jobs.push.lag: the
shortest, across consumers, of their longest wait from due to claimed), sets a **rate** of single
publishes this process takes; the rest are refused at once (503 ``overloaded``, Retry-After). A rate,
not a share: the deliveries keep up with so many publishes a second, whatever is offered, and
when the offered load falls under it (the burst is over) nothing is refused at all.

After each read of the lag (``admit_rate_next``):

- over ``BROKER_PUBLISH_ADMIT_LAG`` and not shrinking by at least ``CATCHING_UP`` seconds a second
  (taken over ``GROWTH_OVER``): the rate is cut to what the deliveries carry. The jobs are claimed
  oldest first, so the lag of what is claimed grows by ``1 - delivered / taken`` a second, where
  *taken* is the rate at which they were published, ``lag`` seconds ago: that rate (or the rate in
  force, if lower) times ``1 - growth`` times ``MARGIN`` (so a cut takes at least 1 - ``MARGIN``),
  at most ``CUT_MAX`` of it, never under ``RATE_MIN``. What is published at a cut is claimed about
  ``lag`` seconds later, and only then does the lag show the cut: the next cut waits that long
  (``cut_hold``), else the lag of the old backlog would cut the rate again and again;
- over it and shrinking: the rate holds (a broker catching up does not at once take in again what
  put it behind);
- over ``STEADY`` times the bound, up to it, and not shrinking: the rate holds;
- under that, shrinking, or no lag reported: the rate rises by ``INCREASE`` a read (or by
  ``INCREASE_OFFERED`` of the offered rate, if more), and is lifted once it is ``LIFT`` times what
  is offered (the load is well under it);
- over ``BACKLOG``: lifted. Such a lag is not a load coming in faster than it goes out (that is
  seen seconds after it begins) but an old backlog being drained: a consumer resumed or an endpoint
  back after an outage with jobs hours old, the only consumer claimed. Its producers keep publishing.

A measured cut, given time to show, and a gentle increase: the rate taken settles near what the
deliveries carry instead of swinging between taking everything and refusing nearly everything (the
first cut, a refused share, swung from 0.95 to 0.2 every ten seconds: 1,500-4,100 accepted/s per
10 s slice of a 6,000/s burst; this: 3,000-4,000).

Read by the publishing thread (its connection) at most every ``READ_EVERY`` before a batch; a rate
not refreshed for ``STALE`` (no batch: nothing published) no longer applies. The rate is enforced by
a token bucket holding ``BUCKET`` seconds of it.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from django.conf import settings

from broker.db.errors import DB_ERRORS
from broker.db.run import query_fetchone
from jobs.publish.queries import Q

logger = logging.getLogger(__name__)
READ_EVERY = 0.5  # seconds between two reads of the engines' reports
FRESH = 5.0  # seconds a report counts (an engine reports every jobs.push.lag.PERIOD while it is behind)
STALE = 3.0  # seconds after the last read when the rate no longer applies
GROWTH_OVER = 2.0  # seconds the lag's growth is taken over
CATCHING_UP = 0.1  # seconds of lag shed per second: the deliveries are catching up
BACKLOG = 60.0  # seconds: a lag longer than this is an old backlog drained, not a load to shed
CUT_MAX = 0.5  # the largest cut (a share of the rate taken)
MARGIN = 0.9  # of what the deliveries carry: room to drain the backlog, and CPU for the answers
STEADY = 0.5  # of the bound: between this and the bound the rate holds
HOLD_MAX = 8.0  # seconds: the longest a cut is given before the next (cut_hold)
INCREASE = 0.05  # the rate's rise per read while the deliveries keep up (about 10 % a second) ...
INCREASE_OFFERED = 0.02  # ... or this share of the offered rate, if more (from RATE_MIN back up in seconds)
LIFT = 1.5  # the rate is lifted once it is this many times what is offered
RATE_MIN = 5.0  # publishes/s a process always takes (they keep the batches, hence the reads, going)
BUCKET = 0.1  # seconds of the rate a burst may take at once
RATE_SMOOTHING = 0.5  # weight of the last read's rates in their running averages
HISTORY = 20.0  # seconds of taken rates kept (the rate jobs now claimed were published at: taken_at)


def admit_rate_next(*, limit: float | None, taken: float, offered: float, lag: float, growth: float,
                    target: float, since_cut: float) -> float | None:
    """The publishes/s to take (None: all) after a read of ``lag`` (seconds) growing by ``growth``
    seconds per second, with ``limit`` in force until now (last cut ``since_cut`` seconds ago),
    ``taken`` publishes/s taken and ``offered`` offered lately (the module docstring's rules)."""
    if target <= 0 or lag > BACKLOG:
        return None
    if lag > target:
        if growth <= -CATCHING_UP or (limit is not None and since_cut < cut_hold(lag)):
            return limit
        base = taken if limit is None else min(limit, taken)
        # FIFO: the lag of what is claimed now grows by 1 - (delivered / taken) a second
        carried = base * (1.0 - min(1.0, max(0.0, growth)))
        return max(RATE_MIN, base * (1.0 - CUT_MAX), MARGIN * carried)
    if limit is None:
        return None
    if lag > target * STEADY and growth >= 0:
        return limit  # near the bound and not shrinking: the rate holds (rising took it over what is carried)
    raised = max(limit * (1.0 + INCREASE), limit + INCREASE_OFFERED * offered)
    return None if raised >= LIFT * offered else raised


def cut_hold(lag: float) -> float:
    """Seconds a cut is given before the next: what is published at a cut is claimed about ``lag``
    seconds later, and only then does the lag say whether the cut was enough."""
    return min(HOLD_MAX, 1.5 * lag + READ_EVERY)


def bucket_size(limit: float) -> float:
    """Tokens the bucket holds at most: BUCKET seconds of the rate, and at least one publish."""
    return max(1.0, limit * BUCKET)


def deliveries_lag() -> float:
    """The push deliveries' lag (seconds) as the dispatcher engines last reported it: the largest
    report fresher than FRESH, 0 while they keep up (admission, and /metrics)."""
    row = query_fetchone(Q.delivery_lag, {"fresh": FRESH})
    return float(row[0] or 0.0) if row else 0.0


class LagAdmission:
    """One process's rate: refreshed by the publishing thread, asked by every single publish (the
    event loop or a request thread: ``refuse``, which alone counts and spends tokens)."""

    def __init__(self) -> None:
        self.limit: float | None = None
        self.taken_rate = 0.0
        self.offered_rate = 0.0
        self._readings: deque[tuple[float, float]] = deque()
        self._taken_history: deque[tuple[float, float]] = deque()  # (read time, taken_rate) over HISTORY
        self._read_at = float("-inf")
        self._cut_at = float("-inf")
        self._counted = (0, 0)  # (taken, offered) at the last read
        self.taken = 0  # publishes taken since the start (refuse's count)
        self.offered = 0
        self._tokens = 0.0
        self._filled_at = 0.0

    def refresh(self) -> None:
        """(the publishing thread, before a batch) A new rate, at most every READ_EVERY."""
        target = float(settings.BROKER_PUBLISH_ADMIT_LAG)
        now = time.monotonic()
        if target <= 0 or now - self._read_at < READ_EVERY:
            return
        since, self._read_at = now - self._read_at, now
        taken, offered = self.taken, self.offered
        fresh = since < STALE  # else the rate in force lapsed (refuse): the rates start again too
        w = RATE_SMOOTHING if fresh else 1.0
        self.taken_rate = w * (taken - self._counted[0]) / since + (1 - w) * self.taken_rate
        self.offered_rate = w * (offered - self._counted[1]) / since + (1 - w) * self.offered_rate
        self._counted = (taken, offered)
        history = self._taken_history
        history.append((now, self.taken_rate))
        while history and now - history[0][0] > HISTORY:
            history.popleft()
        if not fresh:
            self.limit = None
        try:
            lag = deliveries_lag()
        except DB_ERRORS:  # the batch that follows meets the same trouble and answers for it
            logger.debug("delivery lag not read", exc_info=True)
            return
        readings = self._readings
        readings.append((now, lag))
        while len(readings) > 1 and now - readings[0][0] > GROWTH_OVER:
            readings.popleft()
        t0, lag0 = readings[0]
        growth = (lag - lag0) / (now - t0) if now > t0 else 0.0
        limit = admit_rate_next(limit=self.limit, taken=self.taken_at(now - lag), offered=self.offered_rate, lag=lag,
                                growth=growth, target=target, since_cut=now - self._cut_at)
        if limit is not None and (self.limit is None or limit < self.limit):
            self._cut_at = now
        if limit is not None and self.limit is None:
            logger.warning("push deliveries %.1f s behind (growing %.2f s/s): taking %.0f publishes/s of %.0f offered",
                           lag, growth, limit, self.offered_rate)
            self._tokens, self._filled_at = bucket_size(limit), now
        elif limit is None and self.limit is not None:
            logger.info("push deliveries keep up: taking every publish again (%.0f/s offered)", self.offered_rate)
        self.limit = limit

    def taken_at(self, moment: float) -> float:
        """The rate taken at ``moment`` (the last read before it; the oldest kept if none): the
        jobs claimed now were published then."""
        rate = None
        for at, taken in self._taken_history:
            if at > moment:
                break
            rate = taken
        if rate is None:
            rate = self._taken_history[0][1] if self._taken_history else self.taken_rate
        return rate

    def refuse(self) -> bool:
        """Whether to refuse this publish: over the rate in force, while it is fresh (a token bucket)."""
        self.offered += 1
        limit = self.limit
        now = time.monotonic()
        if limit is not None and now - self._read_at <= STALE:
            tokens = min(bucket_size(limit), self._tokens + (now - self._filled_at) * limit)
            self._filled_at = now
            if tokens < 1.0:
                self._tokens = tokens
                return True
            self._tokens = tokens - 1.0
        self.taken += 1
        return False


lag_admission = LagAdmission()
