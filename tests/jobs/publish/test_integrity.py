"""Integrity without foreign keys on the hot tables (broker migration 0010, jobs migration 0027;
docs/architecture.md): jobs_job and broker_message carry no FK constraint, so a publish pays no
check per job at commit. What the constraints guarded, the statements do: a publish locks its
channel's consumers FOR KEY SHARE, and consumer_delete locks the consumer row first, so a job never
outlives its consumer whichever of the two comes first."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.utils.http import http_date

from broker.registry import Precondition
from consumers.models import Consumer
from consumers.queries import Q as CQ
from consumers.services import consumer_delete
from jobs.models import Job
from jobs.publish.auth import publish_authenticate
from jobs.publish.messages import NewMessage, messages_publish

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two(make):
    make.basics()
    make.consumer("c1", type="pull", callback=None)
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    return make


def waiting_on_a_lock(n: int = 1, seconds: float = 10.0) -> None:
    """Until ``n`` other sessions of this database wait on a lock."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cur.fetchone()[0] >= n:
                return
        time.sleep(0.05)
    raise AssertionError("no session waits on a lock")


def writing(seconds: float = 10.0) -> None:
    """Until another session of this database has an open transaction that wrote (an xid)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()")
            if cur.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("no session writes")


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as exc:  # reported by the test
            out["error"] = exc
        finally:
            connections.close_all()
    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def publish_one() -> list:
    ctx = publish_authenticate(channel_id="ch1", channel_token="ch-token", producer_id="p1", producer_token="p-token")
    return messages_publish(ctx=ctx, messages=[NewMessage(payload=b"{}", content_type="application/json")] * 3)


def test_the_hot_tables_have_no_foreign_key_checks(two):
    with connection.cursor() as cur:
        cur.execute("SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f'"
                    " AND conrelid IN ('jobs_job'::regclass, 'broker_message'::regclass)")
        assert cur.fetchall() == []
        cur.execute("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE tgisinternal"
                    " AND tgrelid IN ('jobs_job'::regclass, 'broker_message'::regclass)")
        assert cur.fetchall() == []  # no RI trigger fires on their inserts
    assert [created for _, created in publish_one()] == [True] * 3
    assert Job.objects.count() == 6


def test_a_publish_waits_for_a_consumer_being_deleted_and_gives_it_no_job(two):
    c1 = Consumer.objects.get(consumer_id="c1")
    go = threading.Event()

    def delete_slowly():  # consumer_delete's statements, with a pause before the consumer row goes
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(CQ.consumer_lock_unmodified.sql, [c1.pk, int(c1.updated_at.timestamp())])
            assert cur.fetchone() is not None
            cur.execute(CQ.consumer_jobs_delete.sql, {"consumer": c1.pk})
            go.wait(10)
            cur.execute(CQ.consumer_delete.sql, [c1.pk])
    deleter, deleted = in_thread(delete_slowly)
    time.sleep(0.2)  # the deleter holds its lock (a publish before it would only add jobs it then deletes)
    publisher, published = in_thread(publish_one)
    waiting_on_a_lock()  # the publish waits for the consumer's row
    go.set()
    deleter.join(10)
    publisher.join(10)
    assert "error" not in deleted and "error" not in published, (deleted, published)
    assert [created for _, created in published["value"]] == [True] * 3
    assert not Consumer.objects.filter(pk=c1.pk).exists()
    assert not Job.objects.filter(consumer_id=c1.pk).exists()  # no orphan
    assert Job.objects.filter(consumer__consumer_id="c2").count() == 3


def test_a_consumer_delete_waits_for_a_publish_and_takes_its_jobs(two):
    c1 = Consumer.objects.get(consumer_id="c1")
    go = threading.Event()

    def publish_slowly():
        with transaction.atomic():
            rows = publish_one()
            go.wait(10)
        return rows
    publisher, published = in_thread(publish_slowly)
    writing()  # the publish has stored its rows and holds its locks
    deleter, deleted = in_thread(lambda: consumer_delete(
        consumer=c1, precondition=Precondition(http_date(int(c1.updated_at.timestamp())))))
    waiting_on_a_lock()  # the delete waits for the publish's lock on the consumer
    go.set()
    publisher.join(10)
    deleter.join(10)
    assert "error" not in deleted and "error" not in published, (deleted, published)
    assert not Consumer.objects.filter(pk=c1.pk).exists()
    assert not Job.objects.filter(consumer_id=c1.pk).exists()  # the publish's jobs went with it
    assert Job.objects.filter(consumer__consumer_id="c2").count() == 3
