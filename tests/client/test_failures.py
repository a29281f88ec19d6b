"""Failures the client must survive against a real broker: a consumer process SIGKILLed mid-batch
(its jobs come back after the deadline), SIGTERM draining (finish the jobs in hand, send their acks,
return), 429 from the producer rate limit and the backlog cap, 503s and dropped connections from a
loopback proxy (a retried publish meeting 409 with its own id is a success), request signing."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
from broker_client import Producer, RateLimited, RetryPolicy, Unauthorized

from tests.client.conftest import CHANNEL, CONSUMER_TOKEN, client_env, script
from tests.processes import start_web

CONSUMER_SCRIPT = """
import json, sys, time
from broker_client import PullConsumer

url, ledger, batch, sleep, expires, concurrency = (sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                                                  float(sys.argv[5]), int(sys.argv[6]))
consumer = PullConsumer(url, "ch", "pc", "ct", "pt")

def handler(job):
    with open(ledger, "a") as fh:
        fh.write(f"start {job.id} {job.message_id} {job.attempt}\\n")
    time.sleep(sleep)
    with open(ledger, "a") as fh:
        fh.write(f"done {job.id} {job.message_id} {job.attempt}\\n")

print("ready", flush=True)
stats = consumer.consume(handler, batch=batch, expires=expires, concurrency=concurrency)
print(json.dumps(stats.__dict__), flush=True)
"""


def ledger_lines(path, kind):
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.startswith(kind + " ")]


def start_consumer(tmp_path, url, *, batch, sleep, expires=5.0, concurrency=1):
    ledger = tmp_path / f"ledger-{time.monotonic_ns()}.txt"
    path = script(tmp_path, "consume.py", CONSUMER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(path), url, str(ledger), str(batch), str(sleep), str(expires),
                             str(concurrency)],
                            env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc, ledger


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_a_consumer_killed_mid_batch_has_its_jobs_come_back_after_the_deadline(world, tmp_path):
    world.producer().publish_batch([f"job {i}" for i in range(10)])
    proc, ledger = start_consumer(tmp_path, world.url, batch=10, sleep=0.3)
    try:
        world.wait(lambda: len(ledger_lines(ledger, "done")) >= 3, what="three handled jobs")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop(proc)
    killed_at = time.monotonic()
    assert 3 <= len(ledger_lines(ledger, "done")) < 10
    s = world.stats()
    acked = s["NumDelivered"]  # outcomes it had sent before it died (the rest were in its buffer)
    assert (s["NumAckPending"] + acked, s["NumPending"]) == (10, 0)  # it held the whole batch
    # another consumer gets every job the dead one did not acknowledge, once its deadline passed
    consumer = world.pull_consumer()
    again = []
    while len(again) < 10 - acked:
        assert time.monotonic() - killed_at < 20, "the jobs never came back"
        jobs = consumer.fetch(batch=10, expires=5)
        for job in jobs:
            job.ack()
        again += jobs
    assert len(again) == 10 - acked and all(job.attempt == 2 for job in again)  # redeliveries
    s = world.stats()
    assert (s["NumDelivered"], s["NumAckPending"], s["NumPending"]) == (10, 0, 0)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_sigterm_finishes_the_jobs_in_hand_acks_them_and_stops_pulling(world, tmp_path, concurrency):
    world.producer().publish_batch([f"job {i}" for i in range(20)])
    proc, ledger = start_consumer(tmp_path, world.url, batch=5, sleep=1.0, concurrency=concurrency)
    try:
        world.wait(lambda: ledger_lines(ledger, "start"), what="the first job")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    started, done = ledger_lines(ledger, "start"), ledger_lines(ledger, "done")
    assert len(done) == len(started) == 5  # the whole batch in hand, and nothing pulled after
    assert (stats["received"], stats["delivered"], stats["conflicts"]) == (5, 5, 0)
    s = world.stats()
    assert (s["NumDelivered"], s["NumAckPending"], s["NumPending"]) == (5, 0, 15)


def test_sigterm_during_an_idle_long_poll_returns_at_once(world, tmp_path):
    proc, _ = start_consumer(tmp_path, world.url, batch=10, sleep=0, expires=30)
    try:
        world.wait(lambda: world.stats()["NumWaiting"] == 1, what="the long-poll")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert took < 3, took
    assert json.loads(out.strip().splitlines()[-1])["received"] == 0


def test_429_rate_limit_is_retried_after_retry_after(world):
    r = world.admin.get(f"{world.url}/producer/pr")
    r = world.admin.put(f"{world.url}/producer/pr", data={"rateLimitPerSecond": "1", "burst": "1"},
                        headers={"If-Unmodified-Since": r.headers["Last-Modified"]})
    assert r.status_code == 200, r.text
    impatient = world.producer(retry=RetryPolicy(attempts=0))
    impatient.publish("first")  # the burst
    with pytest.raises(RateLimited) as err:
        impatient.publish("second")
    assert err.value.code == "rate_limited" and err.value.retry_after >= 1
    producer = world.producer()
    started = time.monotonic()
    ids = [producer.publish(f"m{i}") for i in range(3)]
    took = time.monotonic() - started
    assert len(set(ids)) == 3 and took >= 2.0  # 1 message per second, Retry-After honoured
    assert world.stats()["NumPending"] == 4


def test_429_backlog_full_is_retried_until_the_consumer_drains(world):
    r = world.admin.get(f"{world.url}/channel/{CHANNEL}/consumer/pc")
    r = world.admin.put(f"{world.url}/channel/{CHANNEL}/consumer/pc", data={"maxQueued": "2", "type": "pull"},
                        headers={"If-Unmodified-Since": r.headers["Last-Modified"]})
    assert r.status_code == 200, r.text
    producer = world.producer()
    producer.publish("a")
    producer.publish("b")
    done: dict = {}
    thread = threading.Thread(target=lambda: done.setdefault("id", producer.publish("c", message_id="c")))
    thread.start()
    time.sleep(1.5)  # at least one 429 backlog_full answered and retried meanwhile
    assert "id" not in done
    consumer = world.pull_consumer()
    for job in consumer.fetch(batch=2, expires=0):
        job.ack()
    thread.join(15)
    assert done.get("id") == "c"
    [job] = consumer.fetch(batch=5, expires=5)
    assert job.message_id == "c"


def test_503_retries_and_a_409_after_a_lost_answer_is_the_publish_itself(world, proxy):
    producer = Producer(proxy.url, CHANNEL, "ct", "pr", "prt")
    # 1. the broker wrote the message but the answer was lost (503 from the proxy): the retry meets
    #    409 duplicate_message_id with the same, client-generated id, which counts as success
    proxy.plan["/broadcast"] = ["forward-503"]
    started = time.monotonic()
    mid = producer.publish("once")
    assert time.monotonic() - started >= 0.9  # Retry-After: 1
    sent = proxy.requests_to("/broadcast")
    assert len(sent) == 2 and sent[0][2]["X-Broker-Message-ID"] == sent[1][2]["X-Broker-Message-ID"] == mid
    # 2. a dropped connection after the write, then a plain 503: still exactly one message
    proxy.plan["/broadcast"] = ["forward-drop", "503"]
    mid2 = producer.publish("twice")
    assert len(proxy.requests_to("/broadcast")) == 5
    # 3. the batch endpoint: the retried chunk's duplicates are its own
    proxy.plan["/messages"] = ["forward-503"]
    result = producer.publish_batch(["x", "y"])
    assert result.created == 2 and not result.duplicates
    fetcher = world.pull_consumer()
    jobs = fetcher.fetch(batch=10, expires=0)
    assert sorted(j.message_id for j in jobs) == sorted([mid, mid2, *result.message_ids])
    fetcher.ack_many([(j, "DELIVERED") for j in jobs])
    # 4. a consumer's pull and ack are retried too
    proxy.plan["/pull"] = ["503"]
    proxy.plan["/ack"] = ["forward-503"]
    producer.publish("for the consumer")
    consumer = world.pull_consumer(url=proxy.url)
    seen = []
    from tests.client.test_roundtrip import run_consume

    stats = run_consume(consumer, seen.append, until=lambda: seen and world.stats()["NumDelivered"] == 5,
                        batch=10, expires=2)
    assert len(seen) == 1 and stats.delivered == 1 and stats.conflicts == 0
    assert len(proxy.requests_to("/pull")) >= 2 and len(proxy.requests_to("/ack")) == 2


def test_request_signing_for_brokers_with_an_hmac_secret(tmp_path, transactional_db):
    from broker_client import PullConsumer
    from broker_client.http import HmacAuth

    from tests.client.conftest import ADMIN

    secret = base64.b64encode(b"s" * 32).decode()
    proc = start_web(tmp_path, workers=1, threads=4, BROKER_HMAC_SECRET=secret)
    try:
        admin = requests.Session()
        admin.headers.update(ADMIN)
        admin.auth = HmacAuth(secret)
        for path, data in ((f"/channel/{CHANNEL}", {"token": "ct"}), ("/producer/pr", {"token": "prt"}),
                           (f"/channel/{CHANNEL}/consumer/pc", {"token": CONSUMER_TOKEN, "type": "pull"})):
            assert admin.put(proc.url + path, data=data).status_code in (200, 201)
        assert Producer(proc.url, CHANNEL, "ct", "pr", "prt", hmac_secret=secret).publish("signed")
        with pytest.raises(Unauthorized) as err:
            Producer(proc.url, CHANNEL, "ct", "pr", "prt").publish("unsigned")
        assert err.value.code == "signature_required"
        [job] = PullConsumer(proc.url, CHANNEL, "pc", "ct", CONSUMER_TOKEN, hmac_secret=secret).fetch(expires=2)
        assert job.text() == "signed"
        assert job.ack()["Status"] == "DELIVERED"
    finally:
        proc.stop()
