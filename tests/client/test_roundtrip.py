"""Publish and consume through the client against a real broker (gunicorn, 2 workers): payloads and
headers survive the round trip, acks, nacks, dead jobs, progress, batches, scheduling and errors."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from broker_client import Conflict, Forbidden, JobError, NotFound, PreconditionFailed, Reject, Retry, Unauthorized

from tests.client.conftest import CHANNEL


def run_consume(consumer, handler, *, until, timeout=30.0, **options):
    """consume() in a thread until ``until()`` holds; returns its ConsumeStats."""
    result: dict = {}

    def run():
        try:
            result["stats"] = consumer.consume(handler, **options)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    end = time.monotonic() + timeout
    while time.monotonic() < end and not until() and thread.is_alive():
        time.sleep(0.02)
    consumer.stop()
    thread.join(timeout)
    assert not thread.is_alive(), "consume() did not return after stop()"
    if "error" in result:
        raise result["error"]
    return result["stats"]


def test_publish_consume_round_trip_keeps_payload_headers_and_ids(world):
    producer = world.producer()
    sent = {
        producer.publish(b"\x00\xffraw bytes"): (b"\x00\xffraw bytes", "application/octet-stream"),
        producer.publish("text \u00e9"): ("text \u00e9".encode(), "text/plain; charset=utf-8"),
        producer.publish({"n": 1}, priority=5, headers={"X-Trace-Id": "t-1"}): (b'{"n":1}', "application/json"),
        producer.publish(b"<a/>", message_id="given-id", content_type="application/xml"): (b"<a/>", "application/xml"),
    }
    assert "given-id" in sent and all(isinstance(m, str) and m for m in sent)
    consumer = world.pull_consumer()
    seen = []
    stats = run_consume(consumer, seen.append, until=lambda: len(seen) >= 4, batch=100, expires=5)
    assert {j.message_id for j in seen} == set(sent)
    for job in seen:
        assert (job.payload, job.content_type) == sent[job.message_id]
        assert isinstance(job.id, str) and job.attempt == 1 and job.deadline is not None
    first = seen[0]
    assert first.priority == 5 and first.headers == {  # priority first; issue 25: with the message's trace
        "X-Trace-Id": "t-1", "traceparent": first.headers.get("traceparent")}
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", first.headers["traceparent"])
    assert (stats.received, stats.delivered, stats.failed, stats.conflicts) == (4, 4, 0, 0)
    s = world.stats()
    assert (s["NumDelivered"], s["NumAckPending"], s["NumPending"]) == (4, 0, 0)


def test_handler_outcomes_nack_with_delay_reject_and_self_settled(world):
    producer = world.producer()
    ids = {name: producer.publish(name) for name in ("ok", "retry", "reject", "boom", "self")}
    attempts: dict[str, list] = {}

    def handler(job):
        name = job.text()
        attempts.setdefault(name, []).append((job.attempt, time.monotonic()))
        if name == "retry" and job.attempt == 1:
            raise Retry(delay=1.0)
        if name == "reject":
            raise Reject("bad input")
        if name == "boom" and job.attempt == 1:
            raise ValueError("transient")
        if name == "self":
            job.nack(delay=0) if job.attempt == 1 else job.ack()

    stats = run_consume(world.pull_consumer(), handler, batch=10, expires=1, nack_backoff=(0.5,),
                        until=lambda: all(len(attempts.get(n, [])) == 2 for n in ("retry", "boom", "self")))
    assert [a for a, _ in attempts["retry"]] == [1, 2] and [a for a, _ in attempts["boom"]] == [1, 2]
    assert attempts["retry"][1][1] - attempts["retry"][0][1] >= 0.9  # redelivered after its Delay
    assert len(attempts["ok"]) == 1 and len(attempts["reject"]) == 1
    assert stats.failed == 3 and stats.dead == 1
    s = world.stats()
    assert (s["NumDelivered"], s["NumDead"], s["NumPending"], s["NumAckPending"]) == (4, 1, 0, 0)
    assert set(ids) == set(attempts)


def test_fetch_long_polls_until_a_publish_and_job_calls_settle(world):
    consumer = world.pull_consumer()
    producer = world.producer()
    got: dict = {}
    started = time.monotonic()
    thread = threading.Thread(target=lambda: got.setdefault("jobs", consumer.fetch(batch=5, expires=20)))
    thread.start()
    world.wait(lambda: world.stats()["NumWaiting"] == 1, what="the waiting pull")
    producer.publish("wake")
    thread.join(20)
    assert time.monotonic() - started < 10
    [job] = got["jobs"]
    assert job.text() == "wake"
    deadline = job.deadline
    time.sleep(1.0)
    assert job.progress(5) > deadline  # extended past the 1.25 s lease
    time.sleep(1.0)
    answer = job.ack()  # still ours thanks to the progress
    assert answer["Status"] == "DELIVERED"
    with pytest.raises(RuntimeError):
        job.ack()
    producer.publish("late")
    [late] = consumer.fetch(batch=1, expires=5)
    time.sleep(2.0)  # its 1.25 s lease passes: the broker takes it back (at its next sweep)
    assert world.stats()["NumPending"] == 1  # the consumer GET sweeps
    with pytest.raises(JobError) as err:
        late.ack()
    assert err.value.code == "conflict"
    with pytest.raises(Conflict):
        late.progress()
    assert late.lost
    [again] = consumer.fetch(batch=1, expires=5)
    assert again.message_id == late.message_id and again.attempt == 2
    again.dead()
    assert world.stats()["NumDead"] == 1


def test_publish_batch_in_chunks_and_idempotent_ids(world):
    producer = world.producer()
    items = [{"body": {"i": i}, "message_id": f"b{i}"} if i % 2 else f"text {i}" for i in range(2500)]
    result = producer.publish_batch(items)
    assert result.created == 2500 and not result.duplicates and len(result.message_ids) == 2500
    assert result.message_ids[1] == "b1" and len(set(result.message_ids)) == 2500
    again = producer.publish_batch([{"body": "x", "message_id": "b1"}, {"body": "y", "message_id": "new"}])
    assert (again.created, again.duplicates) == (1, ["b1"])
    consumer = world.pull_consumer()
    total = 0
    while True:
        jobs = consumer.fetch(batch=1000, expires=0)
        if not jobs:
            break
        answers = consumer.ack_many([(j, "DELIVERED") for j in jobs])
        assert all(a["Status"] == "DELIVERED" for a in answers)
        total += len(jobs)
    assert total == 2501 and world.stats()["NumDelivered"] == 2501


def test_errors_carry_the_broker_code(world, server):
    producer = world.producer()
    producer.publish("one", message_id="dup")
    with pytest.raises(Conflict) as err:
        producer.publish("two", message_id="dup")  # a first attempt: a real duplicate
    assert err.value.code == "duplicate_message_id" and err.value.status == 409
    from broker_client import Producer, PullConsumer

    with pytest.raises(Forbidden) as err:
        Producer(server.url, CHANNEL, "ct", "pr", "wrong").publish("x")
    assert err.value.code == "producer_token_mismatch"
    with pytest.raises(Unauthorized) as err:
        Producer(server.url, CHANNEL, "ct", "nobody", "x").publish("x")
    assert err.value.code == "producer_not_found"
    with pytest.raises(NotFound) as err:
        PullConsumer(server.url, "nochannel", "pc", "ct", "pt").fetch(expires=0)
    assert err.value.code == "channel_not_found"
    world.consumer("push1", token="t1", type="push", callbackUrl="http://127.0.0.1:9/cb")
    with pytest.raises(PreconditionFailed) as err:
        world.pull_consumer("push1", "t1").fetch(expires=0)
    assert err.value.code == "consumer_not_pull"
    with pytest.raises(ValueError):
        world.pull_consumer().fetch(batch=5000)  # refused before sending (the broker allows 1..1000)


def test_schedule_and_cancel(world):
    producer = world.producer()
    when = datetime.now(timezone.utc) + timedelta(minutes=10)
    mid = producer.publish({"later": True}, scheduled_for=when)
    r = world.admin.get(f"{world.url}/channel/{CHANNEL}/scheduled-message/{mid}")
    assert r.status_code == 200 and r.json()["status"] == "SCHEDULED"
    producer.cancel_scheduled(mid)
    assert world.admin.get(f"{world.url}/channel/{CHANNEL}/scheduled-message/{mid}").status_code == 404
    with pytest.raises(NotFound) as err:
        producer.cancel_scheduled(mid)
    assert err.value.code == "scheduled_message_not_found"


def test_concurrent_handlers_and_a_slow_handler_is_kept_alive_by_progress(world):
    producer = world.producer()
    producer.publish_batch([json.dumps({"i": i}) for i in range(40)])
    lock = threading.Lock()
    seen: list[str] = []
    active = [0, 0]

    def handler(job):
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(3.0 if job.json()["i"] == 0 else 0.05)  # longer than the 1.25 s lease
        with lock:
            active[0] -= 1
            seen.append(job.message_id)

    stats = run_consume(world.pull_consumer(), handler, batch=20, expires=2, concurrency=4,
                        until=lambda: len(seen) >= 40)
    assert len(seen) == 40 and len(set(seen)) == 40  # nothing was taken back and redelivered
    assert active[1] == 4 and stats.progress >= 1 and stats.conflicts == 0 and stats.delivered == 40
    s = world.stats()
    assert (s["NumDelivered"], s["NumRedelivered"], s["NumAckPending"]) == (40, 0, 0)
