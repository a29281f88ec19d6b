"""The wake-up of new jobs: after the commit that made them visible, one debounced NOTIFY per
process (``broker.db.notify``) on the channel every listener (pull waiters, push dispatchers,
doorbells) listens on."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from broker.db.notify import Notifier

CHANNEL = "broker_jobs"
jobs_notifier = Notifier(CHANNEL)


def jobs_wake(*, consumer_ids: Iterable[int] | None) -> None:
    """Wake the listeners of these consumers once the current transaction commits (at once
    outside one); nothing when there are none."""
    ids = {int(i) for i in consumer_ids or () if i is not None}
    if ids:
        transaction.on_commit(lambda: jobs_notifier.send(ids))
