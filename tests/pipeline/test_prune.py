"""The archive's prune deletes a message from the primary only if it still holds what the archive
holds and every job is finished, in the archive and now. The tables are read apart (chunks, a
replica that lags), so the archived job rows may predate a requeue that the archived history
already shows: equal counts alone would then delete an unfinished job. (No Spark: the prune's
statements over the test database.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db.models import Count

from broker.models import Message
from jobs.models import DeliveryAttempt, Job, JobTransition
from pipeline.prune import messages_prune
from tests.pipeline.spark.workload import DELIVERED, QUEUED, Builder, world_create

pytestmark = pytest.mark.django_db


def expected(message: Message, *, finished: int | None = None) -> tuple[int, int, int, int, int]:
    """(id, jobs, transitions, attempts, finished jobs) as an archive made now would hold them."""
    jobs = list(Job.objects.filter(message=message).values_list("pk", flat=True))
    done = Job.objects.filter(message=message, status__in=(DELIVERED, 1004)).count()
    return (message.pk, len(jobs), JobTransition.objects.filter(job_id__in=jobs).count(),
            DeliveryAttempt.objects.filter(job_id__in=jobs).count(), done if finished is None else finished)


def delivered_messages(n: int) -> list[Message]:
    world = world_create(tag="pr")
    builder = Builder(world)
    fates = {c.consumer_id: "delivered" for c, _ in world.consumers}
    at = datetime.now(timezone.utc) - timedelta(days=40)
    return [builder.message(channel=world.channels[0], received_at=at, fates=fates) for _ in range(n)]


def test_prune_deletes_what_matches_and_keeps_what_was_archived_or_is_now_unfinished():
    kept_archived_unfinished, kept_now_unfinished, deleted = delivered_messages(3)
    # archived while a job was (briefly) requeued: the archive's job row is QUEUED, counts equal now
    stale = expected(kept_archived_unfinished, finished=1)
    # a job put back to QUEUED without a history row yet (counts equal, status not)
    want = expected(kept_now_unfinished)
    Job.objects.filter(pk=Job.objects.filter(message=kept_now_unfinished).first().pk).update(status=QUEUED)
    result = messages_prune(expected=[stale, want, expected(deleted)])
    assert sorted(result.changed) == sorted([kept_archived_unfinished.pk, kept_now_unfinished.pk])
    assert result.messages == 1 and result.jobs == 2
    remaining = dict(Message.objects.annotate(n=Count("jobs")).values_list("pk", "n"))
    assert remaining == {kept_archived_unfinished.pk: 2, kept_now_unfinished.pk: 2}
