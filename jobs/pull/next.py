"""When a waiting pull looks again (``pull_next_in``): seconds until the consumer's earliest delayed
job is due and until its earliest in-flight deadline, each walk from its floor (jobs.state.floors)."""

from __future__ import annotations

import time

from broker.db.run import query_fetchone
from jobs.pull.queries import Q
from jobs.state import floors


def pull_next_in(*, consumer_pk: int) -> tuple[float | None, float | None]:
    """(seconds until the earliest delayed job is due, until the earliest in-flight deadline); None
    where there is none. In the caller's transaction, if any."""
    began = time.monotonic()
    (fp, fi), _ = floors.CLAIM_PULL.position(consumer_pk, began)  # the claims' floor: read, not learnt
    rsince, rfull = floors.RETRIES_PULL.time(consumer_pk, began)
    dsince, dfull = floors.DEADLINES.time(consumer_pk, began)
    due_in, deadline_in, rfloor, dfloor = query_fetchone(Q.pull_next, {
        "consumer": consumer_pk, "fp": fp, "fi": fi, "rsince": rsince, "dsince": dsince, "lag": floors.LAG},
        prepare=True)  # a waiting pull asks at every wake-up: planned each time it cost more than it ran
    floors.RETRIES_PULL.walked(consumer_pk, began=began, full=rfull, value=rfloor)
    floors.DEADLINES.walked(consumer_pk, began=began, full=dfull, value=dfloor)
    return due_in, deadline_in
