"""The cluster's task queue (broker.task_queue.OrmQueue): its first look at the queue is one plain
statement (``task_due``), it takes exactly the tasks django-q2's own read would take, and an empty
queue waits for an enqueue's NOTIFY instead of polling."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from broker import task_queue
from broker.task_queue import OrmQueue



@pytest.mark.django_db
def test_an_empty_or_locked_queue_reads_as_none_and_a_due_task_is_taken(monkeypatch, request, django_assert_max_num_queries):
    monkeypatch.setattr(Conf, "POLL", 0.01)  # (its sleep on an empty read without a listener)
    monkeypatch.setattr(task_queue, "TASK_WAIT", 0.01)  # (its wait for a NOTIFY on an empty read)
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
def test_an_empty_queue_waits_for_an_enqueue_and_takes_it_at_once():
    """The reader of an empty queue sleeps on its LISTEN connection (not a poll every
    Q_CLUSTER["poll"]) and an enqueue's NOTIFY ends the wait: a dispatcher loop's hand-over is
    taken at once."""
    queue = OrmQueue(list_key="tq-wake")
    assert queue.dequeue() is None and queue.listener is not None  # (listening from the first read)
    try:
        ended: list[float] = []

        def read() -> None:
            began = time.monotonic()
            try:
                queue.dequeue()  # empty: waits up to TASK_WAIT for a NOTIFY
                ended.append(time.monotonic() - began)
            finally:
                connection.close()  # this thread's own

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.5)
        assert not ended  # still waiting: no poll
        OrmQueue(list_key="tq-wake").enqueue("wake")  # autocommit: the NOTIFY goes at once
        reader.join(task_queue.TASK_WAIT + 2)
        assert ended and ended[0] < task_queue.TASK_WAIT - 2, ended  # woken, not the safety net
        assert [payload for _, payload in queue.dequeue()] == ["wake"]
    finally:
        queue.listener.close()
