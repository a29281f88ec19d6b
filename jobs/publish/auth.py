"""Who may publish, in one prepared query: the channel, the producer and their tokens, the backlog
caps of the channel's consumers (404 / 401 / 403 / 429 as domain errors), then the producer's
token bucket (``producer_rate_take``: n tokens or none, one conditional UPDATE; ``producer_rate_grant``:
as many of n as it holds, one statement for a publishing batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.db.run import query_fetchall
from broker.errors import Forbidden, NotFound, RateLimited, Unauthenticated
from broker.tokens import tokens_equal
from jobs.publish.queries import Q

BACKLOG_RETRY_AFTER = 1  # seconds: a full backlog drains at the consumer's pace


@dataclass
class PublishContext:
    """The authenticated channel and producer of a publish request."""

    channel_pk: int
    channel_id: str
    producer_pk: int
    producer_id: str
    rate: float | None = None  # flow control: the producer's rateLimitPerSecond (None: no limit)
    burst: int | None = None


def publish_authenticate(*, channel_id: str, channel_token: str | None, producer_id: str | None,
                         producer_token: str | None) -> PublishContext:
    """webhook-broker's order of checks: channel 404, channel token 403, producer 401, token 403."""
    rows = query_fetchall(Q.publish_auth, {"producer": producer_id or "", "channel": channel_id}, prepare=True)
    row = rows[0] if rows else None
    if row is None:
        raise NotFound("channel_not_found", "channel not found")
    if not tokens_equal(channel_token, row[1]):
        raise Forbidden("channel_token_mismatch", "channel token does not match")
    if row[2] is None:
        raise Unauthenticated("producer_not_found", "producer could not be found")
    if not tokens_equal(producer_token, row[3]):
        raise Forbidden("producer_token_mismatch", "producer token does not match")
    if row[4] is not None:
        # Checked before the write, so concurrent publishes can pass the cap by at most their own jobs.
        raise RateLimited("backlog_full", f"consumer {row[4]} has reached its maxQueued backlog cap",
                          retry_after=BACKLOG_RETRY_AFTER)
    return PublishContext(channel_pk=row[0], channel_id=channel_id, producer_pk=row[2], producer_id=producer_id,
                          rate=row[5], burst=row[6])


def producer_rate_grant(*, ctx: PublishContext, n: int) -> tuple[int, RateLimited | None]:
    """Spend up to ``n`` tokens of the producer's bucket in one statement, as many as it holds (a
    publishing batch's messages of this producer, in their order): (granted, the 429 refusal of the
    others, None when all were granted). Only called for producers with a limit."""
    rate = float(ctx.rate)
    burst = float(ctx.burst or max(1, math.ceil(rate)))
    rows = query_fetchall(Q.producer_rate_grant, {"producer": ctx.producer_pk, "rate": rate, "burst": burst,
                                                     "n": n}, prepare=True)
    granted = int(rows[0][0]) if rows else 0
    if granted >= n:
        return n, None
    return granted, _rate_limited(ctx, rate, burst, 1)


def _rate_limited(ctx: PublishContext, rate: float, burst: float, n: int) -> RateLimited:
    wait = max(1, math.ceil(min(n, burst) / rate))
    return RateLimited("rate_limited", f"producer {ctx.producer_id} is over its rate limit ({rate:g}/s, burst {burst:g})",
                       retry_after=wait)


def producer_rate_take(*, ctx: PublishContext, n: int) -> None:
    """Spend ``n`` tokens of the producer's bucket or answer 429 ``rate_limited`` with Retry-After
    (seconds until ``n`` tokens could be there). Only called for producers with a limit: others
    pay nothing."""
    rate = float(ctx.rate)
    burst = float(ctx.burst or max(1, math.ceil(rate)))
    rows = query_fetchall(Q.producer_rate_take, {"producer": ctx.producer_pk, "rate": rate,
                                                    "burst": burst, "n": n}, prepare=True)
    if not rows:
        raise _rate_limited(ctx, rate, burst, n)
