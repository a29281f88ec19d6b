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

from jobs import state

# state._PULL_MOVE_AUTH_GROUPED_SQL plus set_config(..., is_local => true): SET LOCAL for the
# statement's own transaction (autocommit), read when it commits. Same plan: the job by primary
# key (jobs_job_pkey), channel and consumer by their unique keys.
_GROUPED_TAIL = "(SELECT u.partition_id FROM u) FROM a"
PULL_MOVE_AUTH_ASYNC_SQL = state._PULL_MOVE_AUTH_GROUPED_SQL.replace(
    _GROUPED_TAIL, "(SELECT u.partition_id FROM u), set_config('synchronous_commit', 'off', true) FROM a")
assert PULL_MOVE_AUTH_ASYNC_SQL.count("set_config") == 1, "_PULL_MOVE_AUTH_GROUPED_SQL changed: update this copy"
MOVED_COLUMN = 12  # as in the grouped statement: the auth row, the policy, moved, partition


def job_move_pull_authenticated_async(*, channel_id: str, consumer_id: str, job_id: int | None,
                                      channel_token: str | None, consumer_token: str | None,
                                      from_statuses: Sequence[int], to_status: int,
                                      incremental_timeout: float | None = None, reason: str = "pull",
                                      connection_timeout: float | None = None) -> tuple[tuple | None, bool, str]:
    """``state.job_move_pull_authenticated_grouped`` committed asynchronously (same checks and
    answer: (auth row, moved, the consumer's priority policy or ''))."""
    row = state._pull_move_auth_run(PULL_MOVE_AUTH_ASYNC_SQL, MOVED_COLUMN, channel_id=channel_id,
                                    consumer_id=consumer_id, job_id=job_id, channel_token=channel_token,
                                    consumer_token=consumer_token, from_statuses=from_statuses,
                                    to_status=to_status, incremental_timeout=incremental_timeout,
                                    reason=reason, connection_timeout=connection_timeout)
    if row is None:
        return None, False, ""
    return row[:11], bool(row[MOVED_COLUMN]), row[11] or ""
