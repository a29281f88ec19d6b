"""maxQueued backlog cap: 429 backlog_full naming the consumer, nothing written; shown on GETs."""

from __future__ import annotations

import threading

import pytest
from rest_framework.test import APIClient

from broker.models import Message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def capped(make):
    make.channel()
    make.producer()
    make.consumer("c1", type="pull", callback=None, maxQueued=3)
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    return make


def test_publish_refused_at_cap(capped, api):
    for _ in range(3):
        assert capped.publish().status_code == 201
    r = capped.publish()
    assert r.status_code == 429, r.content
    assert r.json()["error"] == "backlog_full" and "c1" in r.json()["detail"]
    assert int(r["Retry-After"]) >= 1
    assert Message.objects.count() == 3  # nothing written
    c = api.get("/channel/ch1/consumer/c1").json()
    assert (c["Backlog"], c["MaxQueued"], c["NumPending"]) == (3, 3, 3)
    s = api.get("/channel/ch1/messages-status").json()
    assert s["backlog"]["c1"] == {"Backlog": 3, "MaxQueued": 3}
    assert s["backlog"]["c2"] == {"Backlog": 3, "MaxQueued": None}
    # the consumer drains one: publishing works again
    r = APIClient().post("/channel/ch1/consumer/c1/pull", {"batch": 1}, format="json",
                         HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_CONSUMER_TOKEN="c-token")
    assert len(r.json()["Result"]) == 1
    assert capped.publish().status_code == 201
    assert capped.publish().status_code == 429
    # purge frees the backlog too
    assert api.delete("/channel/ch1/consumer/c1/queued-jobs").json() == {"deletedCount": 3}
    assert capped.publish().status_code == 201


def test_uncapped_channel_is_unaffected(make, api):
    make.channel()
    make.producer()
    make.consumer("c1", type="pull", callback=None)
    assert api.get("/channel/ch1/consumer/c1").json()["MaxQueued"] is None
    for _ in range(20):
        assert make.publish().status_code == 201


def test_cap_with_concurrent_publishes(make, api):
    make.channel()
    make.producer()
    make.consumer("c1", type="pull", callback=None, maxQueued=10)
    codes = []
    lock = threading.Lock()

    def worker():
        from django.db import connection

        try:
            for _ in range(8):
                code = make.publish().status_code
                with lock:
                    codes.append(code)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {201, 429}
    created = codes.count(201)
    # never past the cap by more than the publishes in flight at once (4 threads)
    assert 10 <= created <= 10 + 3, codes
    assert Message.objects.count() == created
    assert api.get("/channel/ch1/consumer/c1").json()["Backlog"] == created
