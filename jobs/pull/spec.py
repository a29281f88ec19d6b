"""The pull-consumer spec path (webhook-broker's): the queued-jobs list, the job state endpoint
(``job_transition``: QUEUED -> INFLIGHT -> DELIVERED / DEAD, DEAD -> INFLIGHT, authenticated and
moved in one statement by ``job_move_spec``), a job's detail, and requeue or delete of a dead job."""

from __future__ import annotations

from typing import Sequence
from urllib.parse import quote

from django.conf import settings

from broker.db.run import query_fetchall, query_fetchone
from broker.errors import Conflict, InvalidInput, NotFound
from broker.times import rfc3339
from broker.tracing import TraceContext
from broker.xid import job_xid
from jobs.ops.dead_jobs import jobs_delete_dead, jobs_requeue_dead
from jobs.partitions.settle import settle_on_commit
from jobs.pull.auth import PullContext, auth_check
from jobs.pull.fields import job_id_parse
from jobs.pull.queries import Q
from jobs.pull.shapes import message_repr, seconds_repr
from jobs.state.retries import inflight_timeout
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED, STATUS_NAMES, transitions_check
from jobs.sweeps.inflight_timeout import consumer_sweep
from jobs.sweeps.message_expiry import job_expired_status

SPEC_STATES = {"INFLIGHT": INFLIGHT, "DELIVERED": DELIVERED, "DEAD": DEAD}


def queued_jobs_list(*, ctx: PullContext, limit: int) -> list[dict]:
    """QUEUED jobs whose next attempt is due, priority descending then oldest first. Not a lease:
    every poller sees the same jobs until one claims them (INFLIGHT)."""
    if limit <= 0:
        return []
    consumer_sweep(consumer_pk=ctx.consumer_pk)
    rows = query_fetchall(Q.queued_jobs, {"consumer": ctx.consumer_pk, "limit": limit}, prepare=True)
    result = []
    for r in rows:
        item = {"ID": job_xid(r[0]), "Priority": r[1], "IncrementalTimeout": seconds_repr(r[2]),
                "Message": message_repr(r[3], bytes(r[4]), r[5], r[6], TraceContext(r[8] or "", r[9] or ""))}
        if r[7] is not None:  # filters: the message's type
            item["Type"] = r[7]
        result.append(item)
    return result


def job_transition(*, channel_id: str, consumer_id: str, job_id: str, channel_token: str | None,
                   consumer_token: str | None, next_state: str, incremental_timeout: float | None) -> int | None:
    """The spec's state endpoint. Allowed: QUEUED->INFLIGHT, INFLIGHT->DELIVERED, INFLIGHT->DEAD,
    DEAD->INFLIGHT (retry + 1, no cap). The same state is a no-op (the caller answers 202; so a
    second claimer of an INFLIGHT job cannot tell it lost unless it sends an IncrementalTimeout,
    which is then a 400 - the ``pull`` endpoint is the safe way to claim). IncrementalTimeout only
    with INFLIGHT from QUEUED or DEAD. Everything else, and a lost race, is a 400.

    One round trip: ``job_move_spec`` reads the auth row and attempts the
    move (guarded by the tokens and the job's status) in one statement; the checks below then
    decide the answer from the row as it was before the move. Committed asynchronously unless
    ``BROKER_PULL_ASYNC_COMMIT`` is off (``job_move_spec`` says why that is safe). Returns the new
    claim's receipt when the job moved to INFLIGHT (jobs.pull.ack), else None."""
    target = SPEC_STATES[next_state]
    if incremental_timeout is not None and target != INFLIGHT:
        from_states: list[int] = []  # never moves; the 400 comes after the auth checks
    else:
        from_states = [QUEUED, DEAD] if target == INFLIGHT else [INFLIGHT]
    row, moved, policy, receipt = job_move_spec(
        channel_id=channel_id, consumer_id=consumer_id, job_id=job_id_parse(job_id),
        channel_token=channel_token, consumer_token=consumer_token, from_statuses=from_states,
        to_status=target, incremental_timeout=incremental_timeout, reason="pull",
        async_commit=settings.BROKER_PULL_ASYNC_COMMIT)
    ctx = auth_check(row, channel_id=channel_id, consumer_id=consumer_id, channel_token=channel_token,
                     consumer_token=consumer_token, with_job=True)
    if moved:
        return receipt if target == INFLIGHT else None
    if target == INFLIGHT and policy not in ("", "none"):  # claims go through the group dispatcher
        raise InvalidInput("group_missing", "Bad Request - Priority Group missing: claim jobs of a consumer "
                                                 "with a priority policy through .../pull with a group")
    current = ctx.job[1]
    if target == INFLIGHT and current in from_states and job_expired_status(job_pk=ctx.job[0]) is not None:
        raise Conflict("message_expired", "the job's message has expired: it is never handed out")
    if incremental_timeout is not None and (target != INFLIGHT or current == INFLIGHT):
        raise InvalidInput("timeout_invalid_state", "timeout provided with invalid state")
    if current == target:
        return None
    if current in from_states:  # it was in a state we could move from, and someone else moved it first
        raise InvalidInput("invalid_transition", "invalid transition request: the job changed state concurrently")
    raise InvalidInput("invalid_transition", "invalid transition request")


def job_detail(*, ctx: PullContext) -> dict:
    """webhook-broker's job shape (status and links) plus retry count, deadline and priority. An
    in-flight job past its deadline is swept first, so the answer never shows a stale lease."""
    if ctx.job[1] == INFLIGHT and ctx.job[4]:
        consumer_sweep(consumer_pk=ctx.consumer_pk, force=True)
    row = query_fetchone(Q.pull_job, [ctx.job[0], ctx.consumer_pk])
    if row is None:
        raise NotFound("job_not_found", "job not found")

    base = f"/channel/{ctx.channel_id}/consumer/{ctx.consumer_id}"
    status = row[1]
    return {
        "ID": job_xid(row[0]),
        "Status": STATUS_NAMES.get(status, str(status)),
        "ListenerEndpoint": row[10],
        "ListenerName": row[11],
        "StatusChangedAt": rfc3339(row[6]),
        "MessageURL": f"/channel/{ctx.channel_id}/message/{quote(row[8], safe='-_.~')}",
        "ChannelURL": f"/channel/{ctx.channel_id}",
        "ConsumerURL": base,
        "ProducerURL": f"/producer/{row[9]}",
        "JobRequeueURL": f"{base}/job/{job_xid(row[0])}/requeue-dead-job" if status == DEAD else "",
        "RetryCount": row[2],
        "Priority": row[3],
        "IncrementalTimeout": seconds_repr(row[4]),
        "Deadline": rfc3339(row[5]) if status == INFLIGHT else None,
        "NextAttemptAt": rfc3339(row[7]) if status == QUEUED else None,
    }


def job_requeue_dead(*, ctx: PullContext) -> None:
    """DEAD -> QUEUED with the retry count reset; a job that is not DEAD is a 400, one whose
    message expired a 409 ``message_expired``."""
    if jobs_requeue_dead(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]], reason="requeue-dead-job") != 1:
        if job_expired_status(job_pk=ctx.job[0]) == DEAD:
            raise Conflict("message_expired", "the job's message has expired: it cannot be delivered any more")
        raise InvalidInput("job_not_dead", "job could not be found in DEAD state")


def job_delete_dead(*, ctx: PullContext) -> None:
    """Delete one dead job; 404 when it is not DEAD (as if there were no such dead job)."""
    if jobs_delete_dead(consumer_pk=ctx.consumer_pk, job_ids=[ctx.job[0]]) != 1:
        raise NotFound("dead_job_not_found", "no such dead job")


def job_move_spec(*, channel_id: str, consumer_id: str, job_id: int | None, channel_token: str | None,
                  consumer_token: str | None, from_statuses: Sequence[int], to_status: int,
                  incremental_timeout: float | None = None, reason: str = "pull",
                  connection_timeout: float | None = None,
                  async_commit: bool = False) -> tuple[tuple | None, bool, str, int | None]:
    """The spec path's state change in one round trip (``pull_move_auth``): read the auth row
    (channel, consumer, job) and, in the same statement, move the job if the tokens match, the
    consumer is a pull consumer and the job is in one of ``from_statuses`` (DEAD -> INFLIGHT adds a
    retry); never to INFLIGHT on a consumer with a priority policy (its claims go through the group
    dispatcher, jobs.pull.groups). The tokens are compared as md5 digests in SQL (timing reveals
    nothing usable about the secret); the caller still checks the returned tokens in constant time
    and decides the HTTP answer from the row as it was before the move. Returns (auth row with
    ``pull_auth``'s columns, moved, the consumer's priority policy or '', the receipt of the claim it
    made when it moved the job to INFLIGHT else None), or (None, False, '', None) for an unknown
    channel. The job's partition is settled after commit when it finished.

    ``async_commit``: the transaction commits without waiting for the WAL flush (``synchronous_commit
    = off`` set in the same statement). A durable commit waits 2-3.5 ms for the disk on the 2-core
    machine, more than all the CPU a state change costs, and the spec path commits twice per job, so
    one client could never pass ~250 jobs/s. A crash of the database server can lose only the last
    moments of such moves, which then read as not made: a lost claim leaves the job QUEUED, a lost
    DELIVERED or DEAD leaves it INFLIGHT until its deadline requeues it; either way it is delivered
    again (at-least-once), and the next durable commit flushes them all."""
    transitions_check((from_status, to_status) for from_status in from_statuses)
    rows = query_fetchall(Q.pull_move_auth, {
        "channel": channel_id, "consumer": consumer_id, "job": job_id,
        "ch_token": channel_token, "c_token": consumer_token,
        "from_s": list(from_statuses), "to_s": to_status, "inc": incremental_timeout,
        "timeout": inflight_timeout(0, connection_timeout), "reason": reason[:32], "async_commit": async_commit,
    }, prepare=True)
    if not rows:
        return None, False, "", None
    row = rows[0]
    moved = bool(row[12])
    if moved and to_status in (DELIVERED, DEAD):
        settle_on_commit([row[13]])
    return row[:11], moved, row[11] or "", row[15] if moved else None
