"""Group commit (jobs.publish.grouped): single publishes that arrive together in one process share one
transaction, and each still gets its own answer: a refusal or a value the database cannot hold fails
only its own request, never the others of its batch. Through the real HTTP views, outside a test
transaction (inside one, publishes run in the request's thread: nothing else could see its rows)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client

from broker.models import Message
from jobs.models import Job
from jobs.publish import grouped

pytestmark = pytest.mark.django_db(transaction=True)
HEADERS = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_PRODUCER_ID": "p1",
           "HTTP_X_BROKER_PRODUCER_TOKEN": "p-token"}


@pytest.fixture
def world(make, settings):
    make.basics()
    make.consumer("c1")
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    settings.BROKER_PUBLISH_WINDOW = 0.3  # a wide window: the publishes below arrive within one
    return make


def publish_together(requests: list[dict]) -> list:
    """Send the requests at once from as many threads; their answers in order."""
    start = threading.Barrier(len(requests))

    def send(extra: dict):
        headers = {**HEADERS, **extra}
        body = headers.pop("body", b'{"n": 1}')
        start.wait()
        try:
            return Client().generic("POST", "/channel/ch1/broadcast", body,
                                    content_type=headers.pop("ctype", "application/json"), **headers)
        finally:
            connection.close()  # this thread's own connection (refusals authenticate in the request's thread)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


def test_publishes_arriving_together_share_a_commit_and_each_is_stored(world):
    publish_together([{"HTTP_X_BROKER_MESSAGE_ID": "warm-up"}])  # the window starts with this batch
    before = grouped._publisher.batches
    answers = publish_together([{"HTTP_X_BROKER_MESSAGE_ID": f"m{i}"} for i in range(12)])
    assert [a.status_code for a in answers] == [201] * 12
    assert [a.headers["Location"].rsplit("/", 1)[1] for a in answers] == [f"m{i}" for i in range(12)]
    assert grouped._publisher.batches - before < 12  # shared transactions (one or two, with the window)
    assert Message.objects.filter(message_id__startswith="m").count() == 12
    assert Job.objects.filter(message__message_id__startswith="m").count() == 24  # a job per consumer


def test_a_refused_or_duplicate_publish_fails_alone(world):
    assert publish_together([{"HTTP_X_BROKER_MESSAGE_ID": "taken"}])[0].status_code == 201
    answers = publish_together([
        {"HTTP_X_BROKER_MESSAGE_ID": "a1"},
        {"HTTP_X_BROKER_MESSAGE_ID": "taken"},  # 409: the id is the channel's already
        {"HTTP_X_BROKER_MESSAGE_ID": "a2", "HTTP_X_BROKER_PRODUCER_TOKEN": "wrong"},  # 403
        {"HTTP_X_BROKER_MESSAGE_ID": "a3"},
        {"HTTP_X_BROKER_MESSAGE_ID": "twice"},
        {"HTTP_X_BROKER_MESSAGE_ID": "twice"},  # the same id twice in one batch: one 201, one 409
    ])
    codes = [a.status_code for a in answers]
    assert codes[:4] == [201, 409, 403, 201] and sorted(codes[4:]) == [201, 409]
    assert answers[1].json()["error"] == "duplicate_message_id"
    assert answers[2].json()["error"] == "producer_token_mismatch"
    assert set(Message.objects.filter(message_id__in=["a1", "a2", "a3", "twice"]).values_list("message_id", flat=True)) \
        == {"a1", "a3", "twice"}


def test_a_value_the_database_cannot_hold_fails_only_its_request(world):
    """A NUL in the content type passes the view's checks but not the database: the batch's statement
    fails, is rolled back, and its messages are published one by one (the others stored, that one 400)."""
    answers = publish_together([
        {"HTTP_X_BROKER_MESSAGE_ID": "b1"},
        {"HTTP_X_BROKER_MESSAGE_ID": "b2", "ctype": "text/plain\x00"},
        {"HTTP_X_BROKER_MESSAGE_ID": "b3"},
    ])
    assert [a.status_code for a in answers] == [201, 400, 201], [a.content for a in answers]
    assert answers[1].json()["error"] == "invalid_input"
    assert set(Message.objects.filter(message_id__startswith="b").values_list("message_id", flat=True)) == {"b1", "b3"}


def test_off_each_publish_commits_in_its_own_request(world, settings):
    settings.BROKER_PUBLISH_GROUP = False
    before = grouped._publisher.batches
    answers = publish_together([{"HTTP_X_BROKER_MESSAGE_ID": f"o{i}"} for i in range(4)])
    assert [a.status_code for a in answers] == [201] * 4
    assert grouped._publisher.batches == before


def test_a_message_queued_behind_a_stuck_batch_is_published_by_its_own_request(world, monkeypatch):
    """The publishing thread stuck on a batch (a connection that stopped answering, until its round
    trip bound) does not hold the other publishes of the process: a message still queued after
    TAKEN_WITHIN is taken back and published in its request's thread."""
    release = threading.Event()
    original = grouped.GroupPublisher._publish

    def stuck(self, items):
        if any(item.message.message_id == "stuck" for item in items):
            release.wait(20)
        return original(self, items)

    monkeypatch.setattr(grouped.GroupPublisher, "_publish", stuck)
    monkeypatch.setattr(grouped, "TAKEN_WITHIN", 0.3)
    answers = {}

    def send(mid):
        try:
            answers[mid] = Client().generic("POST", "/channel/ch1/broadcast", b"{}", content_type="application/json",
                                            HTTP_X_BROKER_MESSAGE_ID=mid, **HEADERS)
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("stuck",))
    first.start()
    time.sleep(0.5)  # the thread has taken "stuck" and hangs on it
    send("queued")  # queued behind it, taken back, published here
    assert answers["queued"].status_code == 201 and "stuck" not in answers
    release.set()
    first.join(20)
    assert answers["stuck"].status_code == 201
    assert set(Message.objects.filter(message_id__in=["stuck", "queued"]).values_list("message_id", flat=True)) \
        == {"stuck", "queued"}


def test_a_producer_publishing_one_at_a_time_is_not_held_by_the_window(world, settings):
    """Only publishes that overlap are gathered: one producer waiting for each answer never has two
    pending, so its next publish goes at once instead of waiting out BROKER_PUBLISH_WINDOW."""
    settings.BROKER_PUBLISH_WINDOW = 3.0  # held, three publishes would take at least 6 s
    grouped._publisher._overlapped = float("-inf")  # no overlap left by an earlier test
    before = grouped._publisher.batches
    began = time.monotonic()
    for i in range(3):
        assert publish_together([{"HTTP_X_BROKER_MESSAGE_ID": f"seq{i}"}])[0].status_code == 201
    assert time.monotonic() - began < 3.0
    assert grouped._publisher.batches - before == 3  # each in its own commit, none waited for company
