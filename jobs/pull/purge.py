"""Flow control: purging a pull or push consumer's QUEUED backlog (``DELETE .../queued-jobs``
and the ``purge_queued`` command). ``olderThan`` parsing is shared by both, so the HTTP and the
command line accept the same times; the delete itself is ``jobs.ops.dead_jobs.jobs_purge_queued``'s batches.
"""

from __future__ import annotations

from datetime import datetime, timezone

from broker.errors import InvalidInput
from jobs.ops.dead_jobs import jobs_purge_queued
from jobs.pull.auth import PullContext


def older_than_parse(raw: str | None) -> dict:
    """``olderThan``: an RFC 3339 time, or an age in seconds. Returns the keyword arguments of
    ``jobs.ops.dead_jobs.jobs_purge_queued`` (empty: no filter); anything else is a 400."""
    if raw is None or raw.strip() == "":
        return {}
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not 0 <= seconds < 1e10 or seconds != seconds:
            raise InvalidInput("invalid_olderThan", "olderThan must be RFC 3339 or non-negative seconds")
        return {"older_than_seconds": seconds}

    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput("invalid_olderThan", "olderThan must be RFC 3339 or non-negative seconds") from None
    if value.tzinfo is None:
        raise InvalidInput("invalid_olderThan", "olderThan needs a time zone offset (RFC 3339)")
    try:  # in UTC: PostgreSQL refuses offsets beyond +-15:59, which RFC 3339 and Python allow
        return {"older_than": value.astimezone(timezone.utc)}
    except OverflowError:
        raise InvalidInput("invalid_olderThan", "olderThan is out of range") from None


def queued_jobs_purge(*, ctx: PullContext, older_than: str | None = None) -> int:
    """Drop the consumer's QUEUED jobs in batches (``jobs.ops.dead_jobs.jobs_purge_queued``); returns the count."""
    return jobs_purge_queued(consumer_pk=ctx.consumer_pk, **older_than_parse(older_than))
