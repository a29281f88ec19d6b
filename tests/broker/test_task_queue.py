"""The cluster's task queue (broker.task_queue.OrmQueue): its first look at the queue is one plain
statement (``task_due``), it takes exactly the tasks django-q2's own read would take, and an empty
queue waits for an enqueue's NOTIFY instead of polling."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from broker import task_queue
from broker.task_queue import OrmQueue


@pytest.fixture
def reads(monkeypatch) -> list[float]:
    """The monotonic time of each read of the queue (``OrmQueue._due``), in order."""
    times: list[float] = []
    due = OrmQueue._due
    monkeypatch.setattr(OrmQueue, "_due", lambda self: times.append(time.monotonic()) or due(self))
    return times


@pytest.mark.django_db
def test_an_empty_or_locked_queue_reads_as_none_and_a_due_task_is_taken(monkeypatch, request, django_assert_max_num_queries):
    monkeypatch.setattr(Conf, "POLL", 0.01)  # (its sleep on an empty read without a listener)
    monkeypatch.setattr(task_queue, "TASK_WAIT", 0.0)  # (every call reads: no wait for a NOTIFY)
    queue = OrmQueue(list_key="tq-test")
    request.addfinalizer(lambda: queue.listener and queue.listener.close())
    with django_assert_max_num_queries(1):  # the empty read: one statement, not django-q2's ORM query
        assert queue.dequeue() is None
    OrmQ.objects.create(key="tq-test", payload="later", lock=timezone.now() + timedelta(minutes=5))
    OrmQ.objects.create(key="tq-other", payload="theirs", lock=timezone.now() - timedelta(seconds=1))
    assert queue.dequeue() is None  # a task taken by another reader (locked ahead), and another queue's
    due = OrmQ.objects.create(key="tq-test", payload="now", lock=timezone.now() - timedelta(seconds=1))
    assert queue.dequeue() == [(due.pk, "now")]
    assert queue.dequeue() is None  # taken: its lock moved ahead by the queue's retry period
    assert OrmQ.objects.get(pk=due.pk).lock > timezone.now()


@pytest.mark.django_db(transaction=True)
def test_an_empty_queue_waits_for_an_enqueue_and_takes_it_at_once(monkeypatch, reads):
    """The reader of an empty queue sleeps on its LISTEN connection: no statement between two
    reads (not one every Q_CLUSTER["poll"]), yet it returns every poll (django-q2's pusher looks
    at its stop event between reads), and an enqueue's NOTIFY makes the next call read: a
    dispatcher loop's hand-over is taken at once."""
    monkeypatch.setattr(Conf, "POLL", 0.2)
    queue = OrmQueue(list_key="tq-wake")
    try:
        assert queue.dequeue() is None and queue.listener is not None and len(reads) == 1
        began, longest = time.monotonic(), 0.0
        while time.monotonic() - began < 1.5:
            call = time.monotonic()
            assert queue.dequeue() is None
            longest = max(longest, time.monotonic() - call)
        assert len(reads) == 1, reads  # 1.5 s of empty calls, no read: TASK_WAIT is 5 s
        assert longest < 0.2 + 0.3, longest  # each came back within a poll
        OrmQueue(list_key="tq-wake").enqueue("wake")  # autocommit: the NOTIFY goes at once
        enqueued, taken = time.monotonic(), None
        while taken is None and time.monotonic() - enqueued < task_queue.TASK_WAIT:
            taken = queue.dequeue()
        assert [payload for _, payload in taken] == ["wake"]
        assert time.monotonic() - enqueued < 1.0  # woken by the NOTIFY, not the 5 s safety net
    finally:
        queue.listener.close()


@pytest.mark.django_db(transaction=True)
def test_a_quiet_queue_is_still_read_every_task_wait(monkeypatch, reads):
    """A task no enqueue announced (django-q2 puts a task back once its retry period passes: it
    only becomes due) is found by the read every TASK_WAIT seconds."""
    monkeypatch.setattr(Conf, "POLL", 0.1)
    monkeypatch.setattr(task_queue, "TASK_WAIT", 0.5)
    queue = OrmQueue(list_key="tq-quiet")
    try:
        assert queue.dequeue() is None
        back = OrmQ.objects.create(key="tq-quiet", payload="back", lock=timezone.now() - timedelta(seconds=1))
        began, taken = time.monotonic(), None
        while taken is None and time.monotonic() - began < 3.0:
            taken = queue.dequeue()
        assert taken == [(back.pk, "back")]
        assert 0.3 < reads[1] - reads[0] < 1.5, reads  # at the safety net's pace, not every poll
    finally:
        queue.listener.close()
