"""Circuit breaker for push consumers.

After ``circuitBreakerFailures`` consecutive failed attempts (5xx, timeout, connection error, 408,
429) a consumer's circuit opens: the push claim gives it no room, so its jobs stay QUEUED without
spending retries, except one probe job every ``circuitBreakerProbeSeconds`` (HALF_OPEN while the
probe is in flight). A failed probe re-opens it without spending the probe job's retry; a
successful one closes it. The state lives in ``consumers_circuit`` and is moved inside the push
statements themselves (``claim_push``, ``push_record`` in jobs/push/queries.sql); this module holds the
rules around them: which answers count, the tallies per batch, advisories, the operator's
"close now", and the read side (consumer GET, admin, /metrics).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.db.run import query_fetchall, query_fetchone
from broker.times import rfc3339
from consumers.models import CircuitState, Consumer
from jobs.advisories.record import advisory_record
from jobs.push.queries import Q

_STATE_NAMES = {s.value: s.name for s in CircuitState}
COUNTED_4XX = (408, 429)  # the client errors that say "try later", not "this request is wrong"


@dataclass
class CircuitTally:
    """One consumer's attempts in a recorded batch, for its circuit breaker: ``ok`` an attempt
    succeeded, ``fails`` the failed attempts after the last success (all of them without one)."""

    consumer_pk: int
    ok: bool
    fails: int
    since: float = 0.0  # seconds since the first of those ``fails`` attempts started (0 without one)


def attempt_failed(*, outcome: str, status_code: int | None) -> bool:
    """Does an attempt count as a failure for the breaker? No answer (connection error, timeout)
    and 5xx, 408, 429 do; a 2xx, 3xx or any other 4xx shows the endpoint is up, and ends a run of
    failures."""
    if outcome in ("timeout", "error"):
        return True
    if status_code is None:
        return outcome not in ("delivered", "gone", "gate")
    return status_code >= 500 or status_code in COUNTED_4XX


def circuit_tallies(attempts) -> list[CircuitTally]:
    """Per consumer, from (consumer pk, failed, dirty, age) in finishing order (``age``: seconds since
    the attempt started): whether any attempt succeeded, the failures after the last success and
    the age of the oldest of them (a timeout has been failing since it started, so an endpoint that
    hangs for longer than ``circuitBreakerOpenAfterSeconds`` opens its circuit with its first
    timeouts, not one timeout later). Only the consumers the record has
    something to do for: a failure, or a circuit that was counting or open when the job was
    claimed (``dirty``; a success resets it); all-success batches of healthy consumers add nothing
    to the statement. So a success of a job claimed before the first failure of a run does not
    end the run when it comes back in a later batch; the next job claimed does."""
    tallies: dict[int, CircuitTally] = {}
    wanted: set[int] = set()
    for consumer_pk, failed, dirty, age in attempts:
        tally = tallies.get(consumer_pk)
        if tally is None:
            tally = tallies[consumer_pk] = CircuitTally(consumer_pk=consumer_pk, ok=False, fails=0)
        if failed:
            tally.fails += 1
            tally.since = max(tally.since, age)
        else:
            tally.ok, tally.fails, tally.since = True, 0, 0.0
        if failed or dirty:
            wanted.add(consumer_pk)
    return [t for t in tallies.values() if t.consumer_pk in wanted]


def circuit_changes_advise(*, changes) -> None:
    """Advisories ``circuit_opened`` / ``circuit_closed`` for the (consumer pk, new state) pairs the
    push record returned (in the dispatcher's transaction, like the record itself)."""
    changes = [(pk, st) for pk, st in changes if st in (CircuitState.OPEN, CircuitState.CLOSED)]
    if not changes:
        return
    rows = query_fetchall(Q.circuit_consumers, {"consumers": [pk for pk, _ in changes]})
    known = {row[0]: row[1:] for row in rows}
    for pk, new_state in changes:
        if pk not in known:
            continue
        consumer_id, channel_id, failures, threshold = known[pk]
        opened = new_state == CircuitState.OPEN
        advisory_record(type="circuit_opened" if opened else "circuit_closed", channel=channel_id,
                        consumer=consumer_id, consumer_pk=pk,
                        data={"failures": failures or 0, "threshold": threshold,
                              "reason": "failures" if opened else "probe_succeeded"})


def consumer_circuit_close(*, consumer: Consumer, reason: str = "operator") -> bool:
    """Close a consumer's circuit now (the admin's "close now"): failures forgotten, delivery
    resumes at once (the push dispatchers are woken). Returns whether it was open or counting;
    an open circuit that closes is an advisory ``circuit_closed``."""
    row = query_fetchone(Q.circuit_close, {"consumer": consumer.pk})
    if row is None:
        return False
    if row[0] != CircuitState.CLOSED:
        advisory_record(type="circuit_closed", channel=consumer.channel.channel_id, consumer=consumer.consumer_id,
                        consumer_pk=consumer.pk, data={"reason": reason})
    return True


def circuit_state(*, consumer: Consumer) -> dict:
    """``Circuit`` of the consumer GET: {State, Since, Failures} (CLOSED since the consumer was
    created while it never failed)."""
    row = query_fetchone(Q.circuit_read, {"consumer": consumer.pk})
    if row is None:
        return {"State": "CLOSED", "Since": rfc3339(consumer.created_at), "Failures": 0}
    return {"State": _STATE_NAMES.get(row[0], "CLOSED"), "Since": rfc3339(row[1]), "Failures": row[2]}


def circuits_open() -> set[int]:
    """Consumers whose circuit is OPEN or HALF_OPEN (/metrics: one small table, no job rows)."""
    return {row[0] for row in query_fetchall(Q.circuits_open)}
