"""/metrics over HTTP after real push deliveries (a receiver on 127.0.0.1 answering 2xx, 3xx, 4xx,
5xx, too slowly, or not at all) and real pulls: attempt outcomes by class, the attempt-duration
and delivery-latency histograms, pull waiters; the same numbers from every gunicorn worker.
Also: every push attempt log line carries the job, message and consumer ids as JSON fields."""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections import Counter

import pytest
import requests
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from broker import delivery_metrics as dm
from broker.logs import JsonFormatter
from broker.xid import job_xid
from jobs.models import DeliveryAttempt, Job, JobStatus
from tests.jobs.conftest import Reply
from tests.processes import start_web

pytestmark = pytest.mark.django_db(transaction=True)
PULL = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "p-token"}
PUSH = {  # consumer -> (callback path or URL, expected attempts by class per message)
    "ok": ("/cb", {"2xx": 1}),
    "e500": ("/e500", {"5xx": 2}),  # maxRetry 1: two attempts
    "e404": ("/e404", {"4xx": 1}),
    "redir": ("/redirect", {"3xx": 1}),
    "slow": ("/slow", {"timeout": 1}),
    "refused": (None, {"error": 1}),
}


def scrape(text: str) -> dict:
    """{(sample name, sorted labels): value}"""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples[(name, tuple(sorted({"channel": "ch1", **labels}.items())))]


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when we return: connections are refused


def test_metrics_match_real_deliveries(make, receiver, dispatcher, caplog, tmp_path):
    receiver.behave("/e500", lambda n, r: Reply(status=500))
    receiver.behave("/e404", lambda n, r: Reply(status=404))
    receiver.behave("/redirect", lambda n, r: Reply(status=302, headers={"Location": "/elsewhere"}))
    receiver.behave("/slow", lambda n, r: Reply(delay=6.0))
    make.channel()
    make.producer()
    for cid, (path, _) in PUSH.items():
        url = receiver.url(path) if path else f"http://127.0.0.1:{closed_port()}/x"
        make.consumer(cid, callback=url, token=f"{cid}-token", maxRetry="1" if cid == "e500" else "0",
                      retryBackoff="0.2", connectionTimeout="2")  # /slow answers after 6 s: a timeout
    make.consumer("p", type="pull", token="p-token", callback=None)
    dispatcher()
    n = 3
    with caplog.at_level(logging.DEBUG, logger="jobs.push.dispatcher"):
        for i in range(n):
            assert make.publish(body=b'{"i": %d}' % i, HTTP_X_BROKER_MESSAGE_ID=f"m{i}").status_code == 201
        receiver.wait(lambda: Job.objects.filter(consumer__type="push", status__in=[JobStatus.QUEUED, JobStatus.INFLIGHT])
                      .count() == 0, timeout=30, what="every push job to end DELIVERED or DEAD")
    pulled = APIClient().post("/channel/ch1/consumer/p/pull", {"batch": 10}, format="json", **PULL).json()["Result"]
    assert len(pulled) == n
    acked = APIClient().post("/channel/ch1/consumer/p/ack", {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"}
                                                                      for j in pulled]}, format="json", **PULL)
    assert acked.status_code == 200

    text = APIClient().get("/metrics").content.decode()
    samples = scrape(text)
    for cid, (_, per_message) in PUSH.items():
        # ground truth: the attempt rows themselves
        rows = list(DeliveryAttempt.objects.filter(job_id__in=Job.objects.filter(consumer__consumer_id=cid)
                                                   .values("id")).values_list("status_code", "outcome", "duration_ms"))
        expected = Counter({k: v * n for k, v in per_message.items()})
        got = Counter({cls: value(samples, "broker_push_attempts_total", consumer=cid, **{"class": cls})
                       for cls in dm.OUTCOME_CODES.values()})
        assert +got == expected, (cid, got)
        assert len(rows) == sum(expected.values())
        count = value(samples, "broker_push_attempt_duration_seconds_count", consumer=cid)
        assert count == len(rows) == value(samples, "broker_push_attempt_duration_seconds_bucket", consumer=cid,
                                           le="+Inf")
        total = value(samples, "broker_push_attempt_duration_seconds_sum", consumer=cid)
        assert abs(total - sum(r[2] for r in rows) / 1000.0) < 0.001 * len(rows)
        buckets = [value(samples, "broker_push_attempt_duration_seconds_bucket", consumer=cid, le=repr(b))
                   for b in dm.ATTEMPT_BOUNDS]
        assert buckets == sorted(buckets)
        for bound, cumulative in zip(dm.ATTEMPT_BOUNDS, buckets):
            assert cumulative == sum(1 for r in rows if r[2] <= bound * 1000.0), (cid, bound)
        if cid == "slow":
            assert value(samples, "broker_push_attempt_duration_seconds_bucket", consumer=cid, le="0.25") == 0
        delivered = n if cid == "ok" else 0
        assert value(samples, "broker_delivery_latency_seconds_count", consumer=cid) == delivered
    for cid in ("ok", "p"):  # push and pull deliveries both have a latency
        assert value(samples, "broker_delivery_latency_seconds_count", consumer=cid) == n
        assert value(samples, "broker_delivery_latency_seconds_bucket", consumer=cid, le="+Inf") == n
        assert 0 < value(samples, "broker_delivery_latency_seconds_sum", consumer=cid) < 120 * n
    assert value(samples, "broker_push_attempts_total", consumer="p", **{"class": "2xx"}) == 0
    assert value(samples, "broker_consumer_pull_waiters", consumer="p") == 0
    assert value(samples, "dead_job_count", consumer="e500") == n

    # several gunicorn workers answer the same numbers: they are read from the database
    web = start_web(tmp_path, workers=2, threads=2)
    try:
        scraped = [scrape(requests.get(f"{web.url}/metrics", timeout=10).text) for _ in range(6)]
    finally:
        web.stop()
    metric_names = ("broker_push_attempts_total", "broker_push_attempt_duration_seconds_bucket",
                    "broker_delivery_latency_seconds_count", "broker_consumer_pull_waiters")
    mine = {k: v for k, v in samples.items() if k[0] in metric_names}
    for other in scraped:
        assert {k: v for k, v in other.items() if k[0] in metric_names} == mine

    # structured delivery log lines: ids as fields, failures at WARNING
    lines = [r for r in caplog.records if r.name == "jobs.push.dispatcher" and r.getMessage().startswith("push attempt")]
    assert len(lines) == sum(sum(v.values()) * n for _, v in PUSH.values())
    job_ids = {job_xid(pk): c for pk, c in Job.objects.values_list("id", "consumer__consumer_id")}  # job IDs
    for record in lines:
        entry = json.loads(JsonFormatter().format(record))
        assert {"job_id", "message_id", "consumer_id", "channel_id", "outcome", "attempt"} <= set(entry)
        assert job_ids[entry["job_id"]] == entry["consumer_id"] and entry["message_id"] in {"m0", "m1", "m2"}
        assert entry["level"] == ("DEBUG" if entry["outcome"] == "delivered" else "WARNING")
        assert "token" not in record.getMessage().lower()


def test_pull_waiters_are_counted_while_they_wait(world):
    client = APIClient()
    done = {}

    def waiter():
        r = client.post("/channel/ch1/consumer/c2/pull", {"batch": 1, "expires": 15}, format="json",
                        HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_CONSUMER_TOKEN="c2-token")
        done["jobs"] = r.json()["Result"]
        connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    waiting = 0
    while time.monotonic() < deadline:
        waiting = value(scrape(APIClient().get("/metrics").content.decode()), "broker_consumer_pull_waiters",
                        consumer="c2")
        if waiting == 1:
            break
        time.sleep(0.05)
    assert waiting == 1
    assert world.publish().status_code == 201
    thread.join(20)
    assert not thread.is_alive() and len(done["jobs"]) == 1
    assert value(scrape(APIClient().get("/metrics").content.decode()), "broker_consumer_pull_waiters",
                 consumer="c2") == 0


def test_migration_constants_match_the_reader():
    migration = importlib.import_module("jobs.migrations.0014_delivery_metrics")
    for name in ("DELIVERY", "ATTEMPT_BUCKET", "ATTEMPT_SUM", "LATENCY_BUCKET", "LATENCY_SUM", "ATTEMPT_BOUNDS",
                 "LATENCY_BOUNDS"):
        assert getattr(migration, name) == getattr(dm, name), name
