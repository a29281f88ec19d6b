"""What sources' requests came to: counts by outcome (accepted, duplicate, challenge, each refusal
reason) and the last refusals with their reasons and times, for the admin, the source's GET and
``broker_source_requests_total`` on /metrics.

A request adds to this process's tally in memory; a thread writes the tally at most once a
second (``FLUSH_EVERY``) as counter deltas (scope ``SOURCE_REQUESTS`` of the maintained counters,
folded by ``counters_compact``) and refusal rows, in one transaction, so a request costs no write
of its own and readers in any process see every process's counts and refusals together. A crash
loses at most the last second's counts, never a message. Inside a transaction (tests; a caller's
``atomic``) the tally is written at once, in that transaction.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque

from django.db import connection, transaction

from broker.counters import counters_forget, counts_for
from broker.db.errors import DB_ERRORS
from broker.db.run import query_execute, query_fetchall
from broker.tallies import TallyWriter
from sources.queries import Q

SOURCE_REQUESTS = 36  # broker_counter scope: owner = source pk, status = an outcome code below
FLUSH_EVERY = 1.0  # seconds between two writes of a process's tally
IDLE_CLOSE = 30.0  # seconds without a write after which the thread closes its connection
REFUSALS_KEPT = 20  # per source

ACCEPTED, DUPLICATE, CHALLENGE = "accepted", "duplicate", "challenge"
# outcome -> counter status; every refusal reason a request may meet has its own
OUTCOMES = {
    ACCEPTED: 1, DUPLICATE: 2, CHALLENGE: 3,
    "signature_missing": 101, "signature_invalid": 102, "timestamp_out_of_tolerance": 103,
    "payload_too_large": 104, "source_disabled": 105, "invalid_message_type": 106, "invalid_content_type": 107,
    "backlog_full": 108, "rate_limited": 109, "database_unavailable": 110, "source_not_found": 111,
    "schema_validation_failed": 112, "unknown_event_type": 113,  # the channel's event types (eventtypes)
    "other": 199,
}
OUTCOME_NAMES = {code: name for name, code in OUTCOMES.items()}
REFUSED_FROM = 100  # codes above are refusals


def outcome_code(outcome: str) -> int:
    return OUTCOMES.get(outcome, OUTCOMES["other"])


class Tally(TallyWriter):
    """This process's counts and refusals since the last write (broker.tallies: the thread)."""

    def __init__(self) -> None:
        super().__init__(name="broker-source-tally", every=FLUSH_EVERY, idle_close=IDLE_CLOSE)
        self._counts: Counter = Counter()  # (source pk, code) -> n
        self._refusals: dict[int, deque] = defaultdict(lambda: deque(maxlen=REFUSALS_KEPT))

    def record(self, *, source_pk: int, outcome: str, detail: str = "", remote: str = "", n: int = 1) -> None:
        code = outcome_code(outcome)
        refusal = (time.time(), outcome, detail[:255], remote[:64]) if code > REFUSED_FROM else None
        if connection.in_atomic_block:
            _write({(source_pk, code): n}, {source_pk: [refusal]} if refusal else {})
            return
        with self.lock:
            self._counts[(source_pk, code)] += n
            if refusal:
                self._refusals[source_pk].append(refusal)
            self.wake()

    def flush(self) -> int:
        """Write what is pending (the thread does it every FLUSH_EVERY s); the rows written. On a
        database error the counts go back into the tally for the next try."""
        with self.lock:
            counts, self._counts = self._counts, Counter()
            refusals, self._refusals = self._refusals, defaultdict(lambda: deque(maxlen=REFUSALS_KEPT))
        if not counts and not refusals:
            return 0
        try:
            return _write(counts, refusals)
        except DB_ERRORS:
            with self.lock:
                self._counts.update(counts)
            raise


def _write(counts: dict, refusals: dict) -> int:
    """The counts and the refusals in one transaction, so a reader never sees a refusal counted
    and missing from the last refusals (or the other way round)."""
    with transaction.atomic(savepoint=False):
        return _write_both(counts, refusals)


def _write_both(counts: dict, refusals: dict) -> int:
    written = 0
    if counts:
        keys = list(counts)
        written += query_execute(Q.source_tallies_add, {
            "owners": [k[0] for k in keys], "statuses": [k[1] for k in keys], "deltas": [counts[k] for k in keys]})
    rows = [(pk, r) for pk, items in refusals.items() for r in items if r]
    if rows:
        written += query_execute(Q.source_refusals_add, {
            "sources": [pk for pk, _ in rows], "ats": [r[0] for _, r in rows], "reasons": [r[1] for _, r in rows],
            "details": [r[2] for _, r in rows], "remotes": [r[3] for _, r in rows]})
        query_execute(Q.source_refusals_trim, {"sources": sorted({pk for pk, _ in rows}), "kept": REFUSALS_KEPT})
    return written


_tally = Tally()


def source_request_count(*, source_pk: int, outcome: str, detail: str = "", remote: str = "", n: int = 1) -> None:
    """Count one request of a source by its outcome (a refusal also joins its last refusals); ``n``:
    as many requests of the same outcome at once (a batch of the group commit)."""
    _tally.record(source_pk=source_pk, outcome=outcome, detail=detail, remote=remote, n=n)


def source_tallies_flush() -> int:
    """Write this process's pending tally now (tests, benchmarks)."""
    return _tally.flush()


def source_tallies_close() -> None:
    _tally.close()


def source_counts(*, source_pks: list[int] | None = None) -> dict[int, dict[str, int]]:
    """{source pk: {outcome: count}} over every process (what has been written)."""
    return {pk: {OUTCOME_NAMES.get(code, "other"): n for code, n in per.items()}
            for pk, per in counts_for(scope=SOURCE_REQUESTS, owner_ids=source_pks).items()}


def source_refusals_recent(*, source_pk: int, limit: int = REFUSALS_KEPT) -> list[dict]:
    """The source's last refusals, newest first: {"at": Unix time... as datetime, reason, detail, remote}."""
    return [{"at": at, "reason": reason, "detail": detail, "remote": remote}
            for at, reason, detail, remote in query_fetchall(Q.source_refusals_recent,
                                                             {"source": source_pk, "limit": limit})]


def source_tallies_forget(*, source_pk: int) -> None:
    """A deleted source's counters and refusals."""
    counters_forget(scope=SOURCE_REQUESTS, owner_id=source_pk)
    query_execute(Q.source_forget, {"source": source_pk})
