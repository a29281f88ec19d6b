"""The housekeeping step that deletes expired dedupe rows (``sources_sourcedelivery``) and the
refusal rows of deleted sources. An expired row already counts as absent (the trigger renews it),
so this only keeps the table to the live windows: at most ``budget`` seconds of batches a call,
every ``PRUNE_EVERY`` seconds in each push dispatcher loop and in the fallback maintenance task.
Registered by ``sources.apps`` (jobs.housekeeping cannot import this app)."""

from __future__ import annotations

import time

from broker.db.run import query_execute
from jobs.housekeeping import Step
from sources.queries import Q

PRUNE_EVERY = 10.0  # seconds between two calls in a dispatcher loop
PRUNE_IDLE_EVERY = 60.0  # ... after a call that found nothing
PRUNE_BATCH = 5_000  # rows per statement (each commits on its own)
PRUNE_BUDGET = 0.5  # seconds a call goes on deleting


def source_deliveries_prune(*, batch: int = PRUNE_BATCH, budget: float = PRUNE_BUDGET) -> int:
    """Delete expired dedupe rows, batch after batch for at most ``budget`` seconds (call it
    outside a transaction); returns the rows deleted (orphaned refusals included)."""
    stop_at = time.monotonic() + budget
    removed = query_execute(Q.source_refusals_orphans_prune)
    while True:
        n = query_execute(Q.source_deliveries_prune, {"batch": batch})
        removed += n
        if n < batch or time.monotonic() >= stop_at:
            return removed


PRUNE_STEP = Step("source_deliveries_pruned", source_deliveries_prune, PRUNE_EVERY, idle_every=PRUNE_IDLE_EVERY)
