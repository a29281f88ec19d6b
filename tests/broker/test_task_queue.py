"""The cluster's task queue (broker.task_queue.OrmQueue): its first look at the queue is one plain
statement (``task_due``), and it takes exactly the tasks django-q2's own read would take."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from broker.task_queue import OrmQueue

pytestmark = pytest.mark.django_db


def test_an_empty_or_locked_queue_reads_as_none_and_a_due_task_is_taken(monkeypatch, django_assert_max_num_queries):
    monkeypatch.setattr(Conf, "POLL", 0.01)  # (its sleep on an empty read)
    queue = OrmQueue(list_key="tq-test")
    with django_assert_max_num_queries(1):  # the empty read: one statement, not django-q2's ORM query
        assert queue.dequeue() is None
    OrmQ.objects.create(key="tq-test", payload="later", lock=timezone.now() + timedelta(minutes=5))
    OrmQ.objects.create(key="tq-other", payload="theirs", lock=timezone.now() - timedelta(seconds=1))
    assert queue.dequeue() is None  # a task taken by another reader (locked ahead), and another queue's
    due = OrmQ.objects.create(key="tq-test", payload="now", lock=timezone.now() - timedelta(seconds=1))
    assert queue.dequeue() == [(due.pk, "now")]
    assert queue.dequeue() is None  # taken: its lock moved ahead by the queue's retry period
    assert OrmQ.objects.get(pk=due.pk).lock > timezone.now()
