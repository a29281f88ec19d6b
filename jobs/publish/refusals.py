"""Publishes refused at once (503 ``overloaded``), counted by why, for ``broker_publish_refused_total``
on /metrics: an operator sees that the broker sheds, how much, and what made it.

Reasons: ``delivery_lag`` (the push deliveries are behind: jobs.publish.admission),
``publishing_queue`` (the oldest publish waiting for the publishing thread waited too long:
jobs.publish.grouped) and ``event_loop`` (the web server's event loop runs behind: web.server.native).
A refusal adds to this process's tally in memory (no write of its own: a shedding broker refuses
thousands a second); a thread (broker.tallies) writes the tally at most once a second as counter
deltas (scope ``PUBLISH_REFUSED``, owner 0, folded by ``counters_compact``), so /metrics in any
process reads every process's refusals. It sleeps while nothing is refused.
"""

from __future__ import annotations

from collections import Counter

from broker.counters import counts_for
from broker.db.errors import DB_ERRORS
from broker.db.run import query_execute
from broker.tallies import TallyWriter
from jobs.publish.queries import Q

PUBLISH_REFUSED = 34  # broker_counter scope: owner 0, status a reason code below
FLUSH_EVERY = 1.0  # seconds between two writes of a process's tally
IDLE_CLOSE = 30.0  # seconds without a refusal after which the thread closes its connection
REASONS = {"delivery_lag": 1, "publishing_queue": 2, "event_loop": 3}


class RefusalTally(TallyWriter):
    """This process's refusals since the last write (broker.tallies: the thread that writes them)."""

    def __init__(self) -> None:
        super().__init__(name="broker-publish-refusals", every=FLUSH_EVERY, idle_close=IDLE_CLOSE)
        self._counts: Counter = Counter()  # reason code -> n

    def record(self, code: int) -> None:
        with self.lock:
            self._counts[code] += 1
            self.wake()

    def flush(self) -> int:
        with self.lock:
            counts, self._counts = self._counts, Counter()
        if not counts:
            return 0
        codes = sorted(counts)
        try:
            return query_execute(Q.publish_refusals_add, {"statuses": codes, "deltas": [counts[c] for c in codes]})
        except DB_ERRORS:
            with self.lock:
                self._counts.update(counts)
            raise


_tally = RefusalTally()


def publish_refusal_count(*, reason: str) -> None:
    """Count one publish refused at once for ``reason`` (a key of REASONS)."""
    _tally.record(REASONS[reason])


def publish_refusals_close() -> None:
    _tally.close()


def publish_refusals_counts() -> dict[str, int]:
    """{reason: publishes refused} over every process (what has been written), every reason named."""
    per = counts_for(scope=PUBLISH_REFUSED, owner_ids=[0]).get(0, {})
    return {name: per.get(code, 0) for name, code in REASONS.items()}
