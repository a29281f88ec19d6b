"""Scan floors on a real database (jobs.state.floors): a claim that starts past the jobs that left
the queue still finds every job that comes back below its floor or commits late."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from broker.models import Channel, Producer
from consumers.models import Consumer
from jobs.publish.auth import PublishContext
from jobs.publish.messages import NewMessage, messages_publish
from jobs.pull.ack import jobs_ack_inflight
from jobs.pull.claim import jobs_claim
from jobs.state import floors
from jobs.state.transitions import DELIVERED, QUEUED

pytestmark = pytest.mark.django_db(transaction=True)


def _ctx() -> PublishContext:
    ch, pr = Channel.objects.get(channel_id="ch1"), Producer.objects.get(producer_id="p1")
    return PublishContext(channel_pk=ch.pk, channel_id="ch1", producer_pk=pr.pk, producer_id="p1")


def _publish(ctx, n: int) -> None:
    messages_publish(ctx=ctx, messages=[NewMessage(payload=b"x", content_type="text/plain") for _ in range(n)])


def _claim_until(consumer_pk: int, want: int, seconds: float = 5.0) -> list:
    got = []
    end = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < end:
        got += jobs_claim(consumer_pk=consumer_pk, limit=100)
        time.sleep(0.05)
    return got


def _walk_past(consumer_pk: int, ctx, seen: list | None = None) -> None:
    """Jobs claimed and acked for more than LAG, so the claims of this process walk from a floor
    (their ids added to ``seen``)."""
    end = time.monotonic() + floors.LAG * 2.5
    while time.monotonic() < end:
        _publish(ctx, 5)
        jobs = jobs_claim(consumer_pk=consumer_pk, limit=100)
        if seen is not None:
            seen.extend(j.id for j in jobs)
        jobs_ack_inflight(consumer_pk=consumer_pk, job_ids=[j.id for j in jobs], to_statuses=[DELIVERED] * len(jobs),
                          delays=[None] * len(jobs), max_retry=5, receipts=[j.receipt for j in jobs])
        time.sleep(0.1)
    (level, first), full = floors.CLAIM_PULL.position(consumer_pk, time.monotonic() + 0.2)
    assert (level, first) != floors.FULL or full  # between the full walks, claims start at a floor


def test_a_job_put_back_below_the_floor_is_claimed_again(world):
    ctx = _ctx()
    pk = Consumer.objects.get(consumer_id="c2").pk
    _walk_past(pk, ctx)
    _publish(ctx, 1)
    [job] = _claim_until(pk, 1)
    # nacked without a delay: QUEUED again at its old id, below the floors of later claims
    moved = jobs_ack_inflight(consumer_pk=pk, job_ids=[job.id], to_statuses=[QUEUED], delays=[0.0], max_retry=5,
                              receipts=[job.receipt])
    assert moved[job.id][0]
    seen: list[int] = []
    _walk_past(pk, ctx, seen)  # claims go on past it meanwhile (fresh jobs come and go)
    end = time.monotonic() + floors.FULL_MAX + 5
    while job.id not in seen and time.monotonic() < end:
        seen.extend(j.id for j in jobs_claim(consumer_pk=pk, limit=100))
        time.sleep(0.05)
    assert job.id in seen


def test_a_job_committed_after_a_later_one_is_claimed(world):
    """A straggler: a job whose id was handed out before another's, committed after it was claimed."""
    ctx = _ctx()
    pk = Consumer.objects.get(consumer_id="c2").pk
    _walk_past(pk, ctx)
    dsn = connection.get_connection_params()
    late = psycopg.connect(**{k: v for k, v in dsn.items() if k not in ("cursor_factory", "context")})
    try:
        with late.cursor() as cur:  # an open transaction holding job ids, not committed yet
            cur.execute("INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, "
                        "priority, headers, status, received_at, dispatched_at) "
                        "VALUES (%s, 'late', %s, 'x', 'text/plain', 0, '{}', 102, now(), now()) RETURNING id",
                        [ctx.channel_pk, ctx.producer_pk])
            mid = cur.fetchone()[0]
            cur.execute("INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, "
                        "next_attempt_at, incremental_timeout, status_changed_at, created_at) "
                        "VALUES (%s, %s, %s, 1001, 0, 0, now(), 0, now(), now()) RETURNING id", [mid, pk, ctx.channel_pk])
            late_id = cur.fetchone()[0]
        done = threading.Event()
        claimed: list[int] = []

        def claims():  # claims go on and take the jobs published after it, past its id
            while not done.is_set():
                _publish(ctx, 2)
                claimed.extend(j.id for j in jobs_claim(consumer_pk=pk, limit=100))
                time.sleep(0.05)
            connection.close()

        worker = threading.Thread(target=claims)
        worker.start()
        time.sleep(floors.LAG * 2)
        late.commit()
        time.sleep(0.2)
        done.set()
        worker.join()
    finally:
        late.close()
    end = time.monotonic() + floors.FULL_MAX + 5
    while late_id not in claimed and time.monotonic() < end:
        claimed.extend(j.id for j in jobs_claim(consumer_pk=pk, limit=100))
        time.sleep(0.05)
    assert late_id in claimed
