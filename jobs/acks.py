"""A pull consumer's outcomes: the spec path's authenticated single-job move (``pull_move_auth``)
and the batch ack (``ack``), both INFLIGHT -> DELIVERED / DEAD / QUEUED (and the spec path's
claims QUEUED / DEAD -> INFLIGHT)."""

from __future__ import annotations

from typing import Sequence

from broker.db.run import query_fetchall
from jobs.queries import Q
from jobs.retries import inflight_timeout
from jobs.settling import settle_on_commit
from jobs.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED, transitions_check


def job_move_pull_authenticated_grouped(*, channel_id: str, consumer_id: str, job_id: int | None,
                                        channel_token: str | None, consumer_token: str | None,
                                        from_statuses: Sequence[int], to_status: int,
                                        incremental_timeout: float | None = None, reason: str = "pull",
                                        connection_timeout: float | None = None) -> tuple[tuple | None, bool, str]:
    """The spec path's state change in one round trip (``pull_move_auth``): read the auth row
    (channel, consumer, job) and, in the same statement, move the job if the tokens match, the
    consumer is a pull consumer and the job is in one of ``from_statuses`` (DEAD -> INFLIGHT adds a
    retry); never to INFLIGHT on a consumer with a priority policy (its claims go through the group
    dispatcher, jobs.groups).

    The tokens are compared as md5 digests in SQL (timing reveals nothing usable about the
    secret); the caller still checks the returned tokens in constant time and decides the HTTP
    answer from the row as it was before the move. Returns (auth row with ``pull_auth``'s
    columns, moved, the consumer's priority policy or ''), or (None, False, '') for an unknown
    channel. The job's partition is settled after commit when it finished."""
    return pull_move_auth_run(channel_id=channel_id, consumer_id=consumer_id, job_id=job_id,
                              channel_token=channel_token, consumer_token=consumer_token,
                              from_statuses=from_statuses, to_status=to_status,
                              incremental_timeout=incremental_timeout, reason=reason,
                              connection_timeout=connection_timeout)


def pull_move_auth_run(*, channel_id: str, consumer_id: str, job_id: int | None,
                       channel_token: str | None, consumer_token: str | None, from_statuses: Sequence[int],
                       to_status: int, incremental_timeout: float | None, reason: str,
                       connection_timeout: float | None, async_commit: bool = False) -> tuple[tuple | None, bool, str]:
    """Run ``pull_move_auth`` and read its answer (see job_move_pull_authenticated_grouped);
    ``async_commit``: its transaction commits without waiting for the WAL flush (jobs.pull_moves)."""
    transitions_check((from_status, to_status) for from_status in from_statuses)
    rows = query_fetchall(Q.pull_move_auth, {
        "channel": channel_id, "consumer": consumer_id, "job": job_id,
        "ch_token": channel_token, "c_token": consumer_token,
        "from_s": list(from_statuses), "to_s": to_status, "inc": incremental_timeout,
        "timeout": inflight_timeout(0, connection_timeout), "reason": reason[:32], "async_commit": async_commit,
    }, prepare=True)
    if not rows:
        return None, False, ""
    row = rows[0]
    moved = bool(row[12])
    if moved and to_status in (DELIVERED, DEAD):
        settle_on_commit([row[13]])
    return row[:11], moved, row[11] or ""


def jobs_ack_inflight(*, consumer_pk: int, job_ids: Sequence[int], to_statuses: Sequence[int],
                      delays: Sequence[float | None], max_retry: int, reason: str = "ack") -> dict[int, tuple]:
    """A pull consumer's outcomes for many in-flight jobs in one statement (the batch ack):
    INFLIGHT -> DELIVERED / DEAD, or QUEUED (negative acknowledgement: retry + 1, due after the
    delay, DEAD past ``max_retry``; waiting pulls are notified). Guarded by INFLIGHT and the
    consumer. Returns {job_id: (moved, status, retry_count)}: for a job that did not move,
    ``status`` is its current one (None when it is not this consumer's)."""
    transitions_check((INFLIGHT, to_status) for to_status in to_statuses)
    if not job_ids:
        return {}
    rows = query_fetchall(Q.ack, {
        "ids": list(job_ids), "to_s": list(to_statuses), "delay": list(delays), "consumer": consumer_pk,
        "max_retry": int(max_retry), "queued": QUEUED, "dead": DEAD, "inflight": INFLIGHT,
        "reason": reason[:32],
    }, prepare=True)
    settle_on_commit(r[5] for r in rows if r[1] is not None and r[1] != QUEUED)
    return {r[0]: (True, r[1], r[2]) if r[1] is not None else (False, r[3], None) for r in rows}
