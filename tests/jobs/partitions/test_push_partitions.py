"""Partitions with push consumers and the real dispatcher: fan-out / fan-in, failures, handler-
driven gates, and the lease check on every delivery."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection

from jobs.models import DeliveryAttempt, Job, JobStatus, JobTransition
from tests.helpers import wait_until
from tests.jobs.conftest import Reply
from tests.jobs.partitions.conftest import advisories

pytestmark = pytest.mark.django_db(transaction=True)


def partition_owner(consumer_id: str, key: str):
    """(owner, lease live) of a partition, read from the receiver's thread."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT p.owner, p.lease_until > now() FROM jobs_partition p JOIN consumers_consumer c "
                        "ON c.id = p.consumer_id WHERE c.consumer_id = %s AND p.key = %s", [consumer_id, key])
            return cur.fetchone()
    finally:
        connection.close()


def wait_for(predicate, timeout=30.0, what="condition"):
    return wait_until(predicate, timeout, what)


def test_fan_out_ten_then_the_summary_after_all_of_them(make, parts, receiver, dispatcher, part_settings, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"))
    log = []

    def reply(n, request):
        body = json.loads(request.body)
        owner = partition_owner("c1", "order-1")
        done = Job.objects.filter(consumer__consumer_id="c1", gate=0, status=JobStatus.DELIVERED).count()
        connection.close()
        log.append((body, request.headers.get("x-broker-gate"), owner, request.headers.get("x-broker-lease-owner"),
                    done))
        return Reply(204, delay=0.05)

    receiver.behave("/cb", reply)
    assert parts.publish("order-1", 0, body=b'{"item": 0}').status_code == 201
    assert parts.publish("order-1", 1, body=b'{"summary": true}').status_code == 201
    for i in range(1, 10):
        assert parts.publish("order-1", 0, body=f'{{"item": {i}}}'.encode()).status_code == 201
    parts.post("c1", "order-1", "close")
    dispatcher()
    wait_for(lambda: parts.get("c1", "order-1")["status"] == "COMPLETE", what="partition complete")
    assert len(log) == 11
    assert [b for b, *_ in log[-1:]] == [{"summary": True}] and log[-1][1] == "1"
    assert sorted(b["item"] for b, *_ in log[:10]) == list(range(10))
    assert log[-1][4] == 10  # all ten delivered before the summary was sent
    for _, _, (owner, live), header_owner, _ in log:
        assert owner == header_owner and live  # delivered only under the worker's own lease
    [adv] = [a for a in advisories(api, "c1") if a["type"] == "partition_complete"]
    assert adv["key"] == "order-1" and adv["counts"]["DELIVERED"] == 11
    assert parts.get("c1", "order-1")["owner"] is None  # complete: lease given back


def test_dead_job_blocks_the_next_gate_until_retried(make, parts, receiver, dispatcher, part_settings, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), maxRetry="0")
    healthy = threading.Event()

    def reply(n, request):
        if json.loads(request.body).get("bad") and not healthy.is_set():
            return Reply(500)
        return Reply(204)

    receiver.behave("/cb", reply)
    parts.publish("p", 0, body=b'{"bad": true}')
    parts.publish("p", 0, body=b'{"ok": 1}')
    parts.publish("p", 1, body=b'{"summary": true}')
    parts.patch("c1", "p", autoClose=True)
    dispatcher()
    wait_for(lambda: parts.get("c1", "p")["status"] == "FAILED", what="partition failed")
    time.sleep(1.0)
    assert not any(json.loads(r.body).get("summary") for r in receiver.at("/cb"))
    assert [a["key"] for a in advisories(api, "c1") if a["type"] == "partition_failed"] == ["p"]
    healthy.set()
    body = parts.post("c1", "p", "retry")
    assert body["requeued"] == 1
    wait_for(lambda: parts.get("c1", "p")["status"] == "COMPLETE", what="partition complete")
    bodies = [json.loads(r.body) for r in receiver.at("/cb")]
    assert bodies[-1] == {"summary": True} and bodies.count({"bad": True}) == 2


def test_handler_driven_gates(make, parts, receiver, dispatcher, part_settings):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), maxRetry="1")

    def reply(n, request):
        gate = int(request.headers["x-broker-gate"])
        body = json.loads(request.body)
        if body.get("mode") == "bad":
            return Reply(200, body=b'{"gate": 0, "done": false}')  # not above the current gate
        if body.get("mode") == "fatal":
            return Reply(200, body=b'{"error": {"message": "cannot parse", "no_retry": true}}')
        if gate == 0:
            return Reply(200, body=json.dumps({"gate": 2, "done": False, "data": {"step": "rank"}}).encode())
        return Reply(200, body=b'{"complete": true, "response": {"ignored": 1}}')

    receiver.behave("/cb", reply)
    receiver.behave("/plain", lambda n, request: Reply(200, body=b'{"gate": 5, "done": false}'))
    make.channel("ch2")
    make.consumer("c9", channel="ch2", callback=receiver.url("/plain"))  # not partitioned: just a 2xx
    make.publish(channel="ch2", body=b'{"plain": true}')
    parts.publish("doc", 0, body=b'{"step": "ocr"}')
    parts.publish("bad", 0, body=b'{"mode": "bad"}')
    parts.publish("fatal", 0, body=b'{"mode": "fatal"}')
    dispatcher()
    wait_for(lambda: Job.objects.filter(consumer__consumer_id="c1",
                                        status__in=[JobStatus.DELIVERED, JobStatus.DEAD]).count() == 3,
             what="three jobs finished")
    wait_for(lambda: Job.objects.filter(consumer__consumer_id="c9", status=JobStatus.DELIVERED).count() == 1,
             what="c9's job delivered")
    assert Job.objects.get(consumer__consumer_id="c9").gate == 0
    seen = [(json.loads(r.body), r.headers["x-broker-gate"], r.headers["x-broker-partition-key"])
            for r in receiver.at("/cb") if r.headers["x-broker-partition-key"] == "doc"]
    assert seen == [({"step": "ocr"}, "0", "doc"), ({"step": "rank"}, "2", "doc")]
    doc = Job.objects.get(partition__key="doc")
    assert doc.status == JobStatus.DELIVERED and doc.gate == 2
    assert JobTransition.objects.filter(job_id=doc.pk, reason="gate").count() == 1
    bad = Job.objects.get(partition__key="bad")
    assert bad.status == JobStatus.DEAD and bad.gate == 0  # two failed attempts (maxRetry 1)
    errors = list(DeliveryAttempt.objects.filter(job_id=bad.pk).values_list("error", flat=True))
    assert len(errors) == 2 and all("gate must be an integer above the current gate 0" in e for e in errors)
    fatal = Job.objects.get(partition__key="fatal")
    assert fatal.status == JobStatus.DEAD
    [attempt] = DeliveryAttempt.objects.filter(job_id=fatal.pk)
    assert attempt.error == "handler error: cannot parse" and attempt.outcome == "dead"
    assert parts.get("c1", "fatal")["status"] == "FAILED"
