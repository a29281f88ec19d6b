"""Who is asking: one prepared query reads the channel, the consumer (and the job of a job URL),
then ``auth_check`` answers in the spec's order (404 / 401 / 403 / 412) and returns the
``PullContext`` every pull route works with."""

from __future__ import annotations

import json
from dataclasses import dataclass

from broker.db.run import query_fetchall
from broker.errors import NotFound, PreconditionFailed
from broker.tokens import token_require
from jobs.pull.fields import job_id_parse
from jobs.pull.queries import Q
from jobs.state.retries import max_retry_for


@dataclass
class PullContext:
    """The authenticated channel and consumer of a pull request (and the job, for job URLs)."""

    channel_pk: int
    channel_id: str
    consumer_pk: int
    consumer_id: str
    consumer_type: str
    max_retry: int
    job: tuple | None = None  # (id, status, retry_count, incremental_timeout, expired)
    policy: str = "none"  # priority groups (jobs.pull.groups)
    groups: list | None = None
    priority_timeout: float | None = None


def pull_authenticate(*, channel_id: str, consumer_id: str, channel_token: str | None,
                      consumer_token: str | None, admin: bool = False, require_pull: bool = True,
                      job_id: str | None = None) -> PullContext:
    """One query for channel, consumer (and job), then ``auth_check``."""
    job_pk = job_id_parse(job_id) if job_id is not None else None
    rows = query_fetchall(Q.pull_auth, {"channel": channel_id, "consumer": consumer_id, "job": job_pk}, prepare=True)
    return auth_check(rows[0] if rows else None, channel_id=channel_id, consumer_id=consumer_id,
                      channel_token=channel_token, consumer_token=consumer_token, admin=admin,
                      require_pull=require_pull, with_job=job_id is not None)


def auth_check(row, *, channel_id: str, consumer_id: str, channel_token: str | None, consumer_token: str | None,
               admin: bool = False, require_pull: bool = True, with_job: bool = False) -> PullContext:
    """Checks in the spec's order on an auth row (``pull_auth``'s columns): channel 404, channel
    token 401/403, consumer 404, consumer token 401/403, push consumer 412, job 404 (unknown, not
    an integer, or another consumer's). ``admin`` (already verified) skips the token checks."""
    if row is None:
        raise NotFound("channel_not_found", "channel not found")
    if not admin:
        token_require(channel_token, row[1], header="X-Broker-Channel-Token", code="channel_token_mismatch",
                      detail="channel token does not match")
    if row[2] is None:
        raise NotFound("consumer_not_found", "consumer not found")
    if not admin:
        token_require(consumer_token, row[3], header="X-Broker-Consumer-Token", code="consumer_token_mismatch",
                      detail="consumer token does not match")
    if require_pull and row[4] != "pull":
        raise PreconditionFailed("consumer_not_pull", "consumer not pull based")
    ctx = PullContext(channel_pk=row[0], channel_id=channel_id, consumer_pk=row[2], consumer_id=consumer_id,
                      consumer_type=row[4], max_retry=max_retry_for(row[5]))
    if len(row) > 11 and row[11] is not None and row[11] != "none":
        groups = row[12]
        ctx.policy = row[11]
        ctx.groups = json.loads(groups) if isinstance(groups, (str, bytes)) else list(groups or [])
        ctx.priority_timeout = row[13]
    if with_job:
        if row[6] is None:
            raise NotFound("job_not_found", "job not found")
        ctx.job = (row[6], row[7], row[8], row[9], bool(row[10]))
    return ctx
