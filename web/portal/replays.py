"""Replays started in the portal run as django-q2 tasks, not in the web request: a window of any size
(``jobs.publish.replay.consumer_replay``, the same replay as the API's, its advisory naming the link)
is walked in turns of ``TURN`` seconds, each a task that keeps its cursor and counts in its
``PortalReplay`` row and enqueues the next turn, so every task stays well inside django-q2's timeout.

One at a time per consumer: the database refuses a second queued or running row (the partial unique
index ``portalreplay_active``); a row whose task died (a worker killed, a cluster stopped) is ended
as failed once it has not moved for ``STALE``, so it never blocks the next replay for long.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django_q.tasks import async_task

from broker.db.errors import DB_ERRORS
from broker.errors import Conflict, DomainError
from broker.times import db_now
from jobs.publish.replay import consumer_replay, replay_window_check
from web.portal.links import PortalAccess
from web.portal.models import PortalReplay, ReplayState
from web.portal.rules import link_label

logger = logging.getLogger("web.portal")
TURN = 60.0  # seconds of replay per task (django-q2's timeout is 150 s)
STALE = timedelta(minutes=10)  # a queued or running replay untouched this long lost its task
ACTIVE = (ReplayState.QUEUED, ReplayState.RUNNING)


def portal_replay_start(*, access: PortalAccess, since: datetime, until: datetime | None,
                        only_failed: bool) -> PortalReplay:
    """Queue a replay of ``access``'s consumer over [since, until] (until: now when empty, fixed
    now); 400 for a window the replay refuses, 409 ``replay_running`` while another one of this
    consumer is queued or running."""
    end = replay_window_check(since=since, until=until, now=db_now())
    consumer = access.consumer
    with transaction.atomic():
        PortalReplay.objects.filter(consumer_id=consumer.pk, state__in=ACTIVE, updated_at__lt=Now() - STALE).update(
            state=ReplayState.FAILED, error="its task ended before the replay did (a worker stopped)", updated_at=Now())
        try:
            with transaction.atomic():
                replay = PortalReplay.objects.create(consumer=consumer, link=access.link, since=since, until=end,
                                                     only_failed=only_failed, created_at=Now(), updated_at=Now())
        except IntegrityError:
            raise Conflict("replay_running", "a replay of this consumer is already queued or running: "
                                             "wait for it to end") from None
    try:
        _enqueue(replay.pk)
    except DB_ERRORS:
        PortalReplay.objects.filter(pk=replay.pk).update(state=ReplayState.FAILED, error="could not be queued",
                                                         updated_at=Now())
        raise
    replay.refresh_from_db()
    return replay


def _enqueue(replay_pk: int) -> None:
    async_task("web.portal.replays.portal_replay_run", replay_pk, task_name=f"portal-replay-{replay_pk}", save=False)


def portal_replay_run(replay_pk: int) -> str:
    """The task: one turn of replay ``replay_pk`` (at most ``TURN`` seconds), then the next turn
    queued, or the row ended (done, with the totals; failed, with the reason)."""
    replay = (PortalReplay.objects.select_related("consumer__channel")
              .filter(pk=replay_pk, state__in=ACTIVE).first())
    if replay is None:
        return f"portal replay {replay_pk}: nothing to do"
    PortalReplay.objects.filter(pk=replay.pk).update(state=ReplayState.RUNNING, updated_at=Now())
    after = (replay.after_at, replay.after_id) if replay.after_at is not None else None
    try:
        result = consumer_replay(consumer=replay.consumer, since=replay.since, until=replay.until,
                                 only_failed=replay.only_failed,
                                 source=link_label(replay.link_id) if replay.link_id else "portal",
                                 after=after, deadline=time.monotonic() + TURN,
                                 carried=(replay.replayed, replay.skipped))
    except DomainError as exc:
        PortalReplay.objects.filter(pk=replay.pk).update(state=ReplayState.FAILED, error=exc.detail[:500],
                                                         updated_at=Now())
        return f"portal replay {replay_pk}: {exc.detail}"
    except Exception as exc:
        PortalReplay.objects.filter(pk=replay.pk).update(state=ReplayState.FAILED, updated_at=Now(),
                                                         error=f"{type(exc).__name__}"[:500])
        logger.exception("portal replay %s failed", replay_pk)
        raise
    if result.after is None:
        PortalReplay.objects.filter(pk=replay.pk).update(state=ReplayState.DONE, replayed=result.replayed,
                                                         skipped=result.skipped, updated_at=Now())
        return f"portal replay {replay_pk}: {result.replayed} replayed, {result.skipped} skipped"
    PortalReplay.objects.filter(pk=replay.pk).update(after_at=result.after[0], after_id=result.after[1],
                                                     replayed=result.replayed, skipped=result.skipped,
                                                     updated_at=Now())
    _enqueue(replay.pk)
    return f"portal replay {replay_pk}: {result.replayed} replayed so far; next turn queued"


def portal_replays(*, consumer_pk: int, limit: int = 10) -> list[PortalReplay]:
    """The consumer's latest portal replays, newest first (the one queued or running first of all)."""
    return list(PortalReplay.objects.filter(consumer_id=consumer_pk).order_by("-id")[:limit])
