"""Group commit (jobs.publish.grouped): single publishes that arrive together in one process share one
transaction, and each still gets its own answer: a refusal or a value the database cannot hold fails
only its own request, never the others of its batch. Through the real HTTP views, outside a test
transaction (inside one, publishes run in the request's thread: nothing else could see its rows)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from django.test import Client

from broker.models import Message
from jobs.models import Job
from jobs.publish import grouped
from tests.processes import wait_for

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


@contextmanager
def consumer_rows_locked():
    """The channel's consumers' rows held FOR UPDATE by another session (the fan-out locks them FOR
    KEY SHARE, so it waits) until the block ends or the yielded event is set."""
    locker, done = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT k.id FROM consumers_consumer k JOIN broker_channel c ON c.id = k.channel_id"
                            " WHERE c.channel_id = 'ch1' FOR UPDATE OF k")
            locker.set()
            done.wait(20)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    locker.wait(10)
    try:
        yield done
    finally:
        done.set()
        holder.join(20)


def batch_held(monkeypatch, message_id: str) -> threading.Event:
    """The publishing thread hangs (outside the database) on the batch holding ``message_id`` until
    the returned event is set."""
    release = threading.Event()
    release.reached = threading.Event()  # the batch is being held
    original = grouped.GroupPublisher._publish

    def held(self, items):
        if any(item.message.message_id == message_id for item in items):
            release.reached.set()
            release.wait(20)
        return original(self, items)

    monkeypatch.setattr(grouped.GroupPublisher, "_publish", held)
    return release


def publish_together(requests: list[dict]) -> list:
    """Send the requests at once from as many threads; their answers in order."""
    start = threading.Barrier(len(requests))

    def send(extra: dict):
        headers = {**HEADERS, **extra}
        body = headers.pop("body", b'{"n": 1}')
        start.wait()
        try:
            return Client(raise_request_exception=False).generic("POST", "/channel/ch1/broadcast", body,
                                    content_type=headers.pop("ctype", "application/json"), **headers)
        finally:
            connection.close()  # this thread's own connection (refusals authenticate in the request's thread)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


def publish_gathered(monkeypatch, settings, requests: list[dict], **gate_headers) -> list:
    """``publish_together``, the requests gathered into one batch whatever the machine's jitter: the
    publishing thread is held on a "the-gate" publish (sent with ``gate_headers``) until every request
    waits in its queue. (Sent together alone, they split into two or more batches on a busy CI
    machine: a test that needs one multi-group batch must not depend on the window catching them.)"""
    monkeypatch.setattr(grouped, "SLOW_AFTER", 60.0)  # the held gate is not a stuck thread
    settings.BROKER_PUBLISH_ADMIT_WAIT = 0  # nor are the publishes behind it refused (on a busy machine the
    # last of them came 0.5 s after the first: admission answered them 503 overloaded)
    release = batch_held(monkeypatch, "the-gate")
    gate_answer: dict = {}
    gate = threading.Thread(target=send_one, args=(gate_answer, "the-gate"), kwargs=gate_headers)
    gate.start()
    try:
        assert release.reached.wait(10), "the publishing thread took the gate"
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(publish_together, requests)
            assert wait_for(lambda: len(grouped._publisher._queue) >= len(requests), 10, 0.01), \
                "every request waits in the queue"
            release.set()
            answers = sent.result(30)
    finally:
        release.set()
        gate.join(20)
    assert gate_answer["the-gate"].status_code == 201
    return answers


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


def send_one(answers: dict, mid: str, **extra) -> None:
    try:
        answers[mid] = Client().generic("POST", "/channel/ch1/broadcast", b"{}", content_type="application/json",
                                        HTTP_X_BROKER_MESSAGE_ID=mid, **{**HEADERS, **extra})
    finally:
        connection.close()


def test_a_stuck_thread_is_replaced_and_the_queue_goes_on(world, monkeypatch):
    """The publishing thread stuck on a batch (here: hanging outside the database, its session idle)
    does not hold the other publishes of the process: the watch sees its session is not working on
    the batch and a new thread takes over the queue; the stuck one still answers its own batch."""
    release = batch_held(monkeypatch, "stuck")
    monkeypatch.setattr(grouped, "SLOW_AFTER", 0.3)
    replaced = grouped._publisher.replaced
    answers: dict = {}
    first = threading.Thread(target=send_one, args=(answers, "stuck"))
    first.start()
    try:
        # the thread has taken "stuck" and hangs on it (a fixed sleep lost this race on a busy machine)
        assert release.reached.wait(10)
        began = time.monotonic()
        send_one(answers, "queued")  # queued behind it, published by the new thread
        assert answers["queued"].status_code == 201 and "stuck" not in answers
        assert time.monotonic() - began < 5 and grouped._publisher.replaced == replaced + 1
    finally:
        release.set()  # (a failure here must not leave the thread hung for the tests after it)
        first.join(20)
    assert answers["stuck"].status_code == 201
    assert set(Message.objects.filter(message_id__in=["stuck", "queued"]).values_list("message_id", flat=True)) \
        == {"stuck", "queued"}


def test_a_slow_batch_is_waited_for_not_taken_over(world, monkeypatch, settings):
    """A batch that is merely slow (its statement waits for a lock: its session is active) is left
    alone: the publishes queued behind it wait and then share one commit; none is published on a
    connection of its own (the old rule took each back after a second, adding load when the database
    was slowest)."""
    monkeypatch.setattr(grouped, "SLOW_AFTER", 0.3)
    settings.BROKER_PUBLISH_ADMIT_WAIT = 0  # (admission would refuse those queued last: not what is tested here)
    publish_together([{"HTTP_X_BROKER_MESSAGE_ID": "warm"}])
    replaced, slow, batches = grouped._publisher.replaced, grouped._publisher.slow, grouped._publisher.batches
    answers: dict = {}
    with consumer_rows_locked() as release:
        first = threading.Thread(target=send_one, args=(answers, "slow"))
        first.start()
        time.sleep(0.3)
        queued = [threading.Thread(target=send_one, args=(answers, f"behind{i}")) for i in range(5)]
        for t in queued:
            t.start()
        time.sleep(1.5)  # well past SLOW_AFTER: looked at, found working, left alone
        assert not answers and grouped._publisher.slow > slow and grouped._publisher.replaced == replaced, {k: v.content for k, v in answers.items()}
        release.set()
        for t in [first, *queued]:
            t.join(20)
    assert [answers[m].status_code for m in ["slow", *(f"behind{i}" for i in range(5))]] == [201] * 6
    assert grouped._publisher.batches - batches <= 2  # the slow one, then the five together
    assert grouped._publisher.replaced == replaced


def test_a_batch_past_its_bound_is_refused_and_rolled_back(world, monkeypatch, settings):
    """With BROKER_DB_TIMEOUT 0 the publishing thread still bounds its round trips (PUBLISH_BOUND),
    and the server cancels the statement first: the publish answers 503 and its row never commits,
    even once the lock it waited for is gone."""
    settings.BROKER_DB_TIMEOUT = 0
    monkeypatch.setattr(grouped, "PUBLISH_BOUND", 1.0)
    monkeypatch.setattr(grouped, "SLOW_AFTER", 0.3)
    grouped.grouped_publisher_close()  # the next batch opens a session with the new bound
    answers: dict = {}
    with consumer_rows_locked():
        began = time.monotonic()
        send_one(answers, "bounded")
        took = time.monotonic() - began
    assert answers["bounded"].status_code == 503 and answers["bounded"]["Retry-After"], answers["bounded"].content
    assert took < 5
    time.sleep(0.5)
    assert not Message.objects.filter(message_id="bounded").exists()
    grouped.grouped_publisher_close()


def two_producers(world):
    world.producer("p2", token="p2-token")
    return {"HTTP_X_BROKER_PRODUCER_ID": "p2", "HTTP_X_BROKER_PRODUCER_TOKEN": "p2-token"}


def test_an_error_after_the_first_group_answers_no_201(world, monkeypatch, settings):
    """Issue 38: a batch of two groups (two producers) in one transaction; an exception that is
    neither a database nor a domain error after the second group's statement rolls both back, so no
    publish of that batch may answer 201 (the first group's ids were set before the commit)."""
    p2 = two_producers(world)
    publish_together([{"HTTP_X_BROKER_MESSAGE_ID": "warm"}])
    original = grouped.messages_publish
    in_block: list[list[str]] = []  # the message ids of each group of the failing transaction

    def second_group_fails(*, ctx, messages):
        result = original(ctx=ctx, messages=messages)
        if connection.in_atomic_block:  # (a multi-group batch: its groups share a transaction)
            in_block.append([m.message_id for m in messages])
            if len(in_block) == 2:
                raise RuntimeError("injected after the second group's statement")
        return result

    monkeypatch.setattr(grouped, "messages_publish", second_group_fails)
    requests = [{"HTTP_X_BROKER_MESSAGE_ID": f"g{i}", **(p2 if i % 2 else {})} for i in range(6)]
    answers = publish_gathered(monkeypatch, settings, requests)
    assert len(in_block) == 2, "a batch of two groups ran"
    failed = {mid for group in in_block for mid in group}
    codes = {f"g{i}": a.status_code for i, a in enumerate(answers)}
    assert all(codes[mid] == 500 for mid in failed), codes
    assert not Message.objects.filter(message_id__in=failed).exists()
    stored = set(Message.objects.filter(message_id__startswith="g").values_list("message_id", flat=True))
    assert stored == {mid for mid, code in codes.items() if code == 201}  # every 201 is a stored row, no other


def test_a_failing_commit_of_a_batch_publishes_each_again(world, monkeypatch, settings):
    """A multi-group batch whose COMMIT fails is rolled back and published again one by one: every
    201 is a stored row, and each message is stored once."""
    p2 = two_producers(world)
    publish_together([{"HTTP_X_BROKER_MESSAGE_ID": "warm"}])
    from broker.db.backend.base import DatabaseWrapper
    from django.db import OperationalError

    original = DatabaseWrapper._commit
    failed = []

    def commit_fails_once(self):
        if threading.current_thread().name == "broker-publish" and not failed:
            failed.append(True)
            raise OperationalError("injected: COMMIT failed")
        return original(self)

    monkeypatch.setattr(DatabaseWrapper, "_commit", commit_fails_once)
    requests = [{"HTTP_X_BROKER_MESSAGE_ID": f"k{i}", **(p2 if i % 2 else {})} for i in range(6)]
    answers = publish_gathered(monkeypatch, settings, requests)
    assert failed, "the batch's COMMIT ran (a multi-group batch)"
    assert [a.status_code for a in answers] == [201] * 6, [a.content for a in answers]
    stored = list(Message.objects.filter(message_id__startswith="k").values_list("message_id", flat=True))
    assert sorted(stored) == [f"k{i}" for i in range(6)]


def test_a_rate_limited_producer_takes_a_batch_of_tokens_in_one_statement(world, monkeypatch, settings):
    """Issue 38: the batch's messages of a rate-limited producer take their tokens in one statement,
    as many as the bucket holds, in order: the rest are refused 429 as separate requests would be."""
    r = world.api.put("/producer/p1", {"rateLimitPerSecond": "0.001", "burst": "3"},
                      HTTP_IF_UNMODIFIED_SINCE=world.api.get("/producer/p1")["Last-Modified"])
    assert r.status_code == 200, r.content
    calls = []
    original = grouped.producer_rate_grant

    def counted(*, ctx, n):
        calls.append(n)
        return original(ctx=ctx, n=n)

    monkeypatch.setattr(grouped, "producer_rate_grant", counted)
    # (the gate from another producer: p1's bucket is for the six)
    answers = publish_gathered(monkeypatch, settings, [{"HTTP_X_BROKER_MESSAGE_ID": f"r{i}"} for i in range(6)],
                               **two_producers(world))
    codes = [a.status_code for a in answers]
    assert sorted(codes) == [201] * 3 + [429] * 3, codes
    assert all(a.json()["error"] == "rate_limited" and int(a["Retry-After"]) >= 1 for a in answers if a.status_code == 429)
    assert calls == [6], calls  # one statement for the batch
    assert Message.objects.filter(message_id__startswith="r").count() == 3


def test_admission_refuses_at_once_when_the_queue_waits_too_long(world, monkeypatch, settings):
    """A publish arriving while those queued before it have waited longer than
    BROKER_PUBLISH_ADMIT_WAIT is refused at once: 503 overloaded with Retry-After, nothing stored."""
    settings.BROKER_PUBLISH_ADMIT_WAIT = 0.2
    release = batch_held(monkeypatch, "holder")
    monkeypatch.setattr(grouped, "SLOW_AFTER", 30.0)  # (not replaced: held on purpose)
    answers: dict = {}
    threads = [threading.Thread(target=send_one, args=(answers, "holder"))]
    threads[0].start()
    assert release.reached.wait(10), "the holder's batch began"
    threads.append(threading.Thread(target=send_one, args=(answers, "waiting")))
    threads[1].start()
    queued = lambda: any(item.message.message_id == "waiting" for item in list(grouped._publisher._queue))  # noqa: E731
    assert wait_for(queued, timeout=10, interval=0.01), "waiting is queued behind the held batch"
    time.sleep(0.4)  # "waiting" has waited past the admission bound
    began = time.monotonic()
    send_one(answers, "refused")
    assert time.monotonic() - began < 1.0
    refused = answers["refused"]
    assert refused.status_code == 503 and refused.json()["error"] == "overloaded" and refused["Retry-After"] == "1"
    release.set()
    for t in threads:
        t.join(20)
    assert answers["holder"].status_code == 201 and answers["waiting"].status_code == 201
    assert not Message.objects.filter(message_id="refused").exists()


class _Pressure:
    """The machine's CPU pressure as broker.pressure would read it from the kernel (its parsing and
    arithmetic are tested in tests/broker/unit/test_pressure.py)."""

    def __init__(self, share: float) -> None:
        self.value = share

    def share(self) -> float:
        return self.value


def test_under_cpu_pressure_a_publish_is_refused_once_the_batch_in_flight_runs_long(world, monkeypatch, settings):
    """While the machine's CPU pressure is at least BROKER_PUBLISH_ADMIT_PRESSURE, a publish that
    would wait behind a batch running longer than BROKER_PUBLISH_ADMIT_PRESSED_WAIT is refused at
    once (503 overloaded, Retry-After), far below the queue's own bound; without pressure it waits
    for its turn and is stored."""
    settings.BROKER_PUBLISH_ADMIT_WAIT = 5.0
    settings.BROKER_PUBLISH_ADMIT_PRESSURE = 0.8
    settings.BROKER_PUBLISH_ADMIT_PRESSED_WAIT = 0.1
    pressure = _Pressure(0.9)
    monkeypatch.setattr(grouped, "cpu_pressure", pressure)
    release = batch_held(monkeypatch, "holder")
    monkeypatch.setattr(grouped, "SLOW_AFTER", 30.0)  # (not replaced: held on purpose)
    answers: dict = {}
    threads = [threading.Thread(target=send_one, args=(answers, "holder"))]
    threads[0].start()
    time.sleep(0.4)  # the holder's batch has run past the pressed bound
    began = time.monotonic()
    send_one(answers, "pressed")
    assert time.monotonic() - began < 1.0
    refused = answers["pressed"]
    assert refused.status_code == 503 and refused.json()["error"] == "overloaded" and refused["Retry-After"] == "1"
    pressure.value = 0.5  # the pressure is gone: the next one queues behind the batch
    threads.append(threading.Thread(target=send_one, args=(answers, "unpressed")))
    threads[1].start()
    time.sleep(0.3)
    assert "unpressed" not in answers  # waiting for its turn, not refused
    release.set()
    for t in threads:
        t.join(20)
    assert answers["holder"].status_code == 201 and answers["unpressed"].status_code == 201
    assert not Message.objects.filter(message_id="pressed").exists()
    assert Message.objects.filter(message_id="unpressed").exists()


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
