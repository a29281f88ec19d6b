"""The spec path's job state change (POST .../job/{id}) committed without waiting for the WAL flush.

A durable commit waits for the WAL to reach the disk: 2-3.5 ms on the 2-core machine, more than
all the CPU a state change costs, and the spec path commits twice per job (INFLIGHT, then
DELIVERED), so one client could never go past ~250 jobs/s. These moves are safe to commit
asynchronously (``synchronous_commit = off`` for that one transaction; PostgreSQL never
reorders or half-applies it): a crash of the database server can lose only the last moments of
such moves, which then read as not made. A lost claim leaves the job QUEUED and a lost DELIVERED
or DEAD leaves it INFLIGHT until its deadline requeues it: either way it is delivered again,
which at-least-once delivery allows, and the next durable commit (any publish) flushes all of
them. Publishing, the fast path's pull and ack, and operator actions keep durable commits.
``BROKER_PULL_ASYNC_COMMIT = False`` makes these durable too.
"""

from __future__ import annotations

from typing import Sequence

from jobs.acks import pull_move_auth_run


def job_move_pull_authenticated_async(*, channel_id: str, consumer_id: str, job_id: int | None,
                                      channel_token: str | None, consumer_token: str | None,
                                      from_statuses: Sequence[int], to_status: int,
                                      incremental_timeout: float | None = None, reason: str = "pull",
                                      connection_timeout: float | None = None) -> tuple[tuple | None, bool, str]:
    """``state.job_move_pull_authenticated_grouped`` committed asynchronously (``pull_move_auth`` with
    ``async_commit``: set_config('synchronous_commit', 'off', true) in the same statement; same
    checks and answer: (auth row, moved, the consumer's priority policy or ''))."""
    return pull_move_auth_run(channel_id=channel_id, consumer_id=consumer_id,
                              job_id=job_id, channel_token=channel_token, consumer_token=consumer_token,
                              from_statuses=from_statuses, to_status=to_status,
                              incremental_timeout=incremental_timeout, reason=reason,
                              connection_timeout=connection_timeout, async_commit=True)
