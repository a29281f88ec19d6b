"""Retention as users run it: gunicorn and ``manage.py qcluster`` as real processes, everything over
HTTP on loopback. Nobody calls the sweep: the dispatcher loops' housekeeping removes the finished
messages within seconds of passing the channel's window (the issue asks for within a minute), and a
message with a QUEUED or an INFLIGHT job stays; the channel and consumer GETs and /metrics show it."""

from __future__ import annotations

import re
import time

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.processes import start_qcluster, start_web, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"BROKER_Q_WORKERS": "2", "BROKER_PUSH_POLL": "0.2", "BROKER_RATIONAL_DELAY": "0.5"}
PUBLISH = {"X-Broker-Channel-Token": "ch-token", "X-Broker-Producer-ID": "p1", "X-Broker-Producer-Token": "p-token",
           "Content-Type": "application/json"}
PULL = {"X-Broker-Channel-Token": "ch-token", "X-Broker-Consumer-Token": "c2-token"}
WITHIN = 60.0  # the bound: removed within a minute of passing the window


def test_the_dispatcher_loops_remove_finished_messages_within_a_minute_and_keep_unfinished_ones(
        tmp_path, receiver):
    web = start_web(tmp_path)
    cluster = start_qcluster(tmp_path, **ENV)  # its loops start while the registry is made
    try:
        s = requests.Session()
        s.headers["X-Broker-Admin-Token"] = ADMIN_TOKEN
        url = web.url
        assert s.put(f"{url}/channel/ch1", data={"token": "ch-token", "retention": "2s"}).json()["Retention"] == "2s"
        assert s.put(f"{url}/producer/p1", data={"token": "p-token"}).status_code == 200
        assert s.put(f"{url}/channel/ch1/consumer/c1",
                     data={"token": "c-token", "callbackUrl": receiver.url("/cb")}).status_code == 200
        assert s.put(f"{url}/channel/ch1/consumer/c2", data={"token": "c2-token", "type": "pull"}).status_code == 200
        pull = f"{url}/channel/ch1/consumer/c2"

        for mid in ("a", "b"):
            r = s.post(f"{url}/channel/ch1/broadcast", data=b'{"k": 1}', headers={**PUBLISH, "X-Broker-Message-ID": mid})
            assert r.status_code == 201, r.text
        jobs = s.post(f"{pull}/pull", json={"batch": 10}, headers=PULL).json()["Result"]
        assert sorted(j["Message"]["MessageID"] for j in jobs) == ["a", "b"]
        r = s.post(f"{pull}/ack", json={"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}, headers=PULL)
        assert r.status_code == 200, r.text
        for mid in ("inflight", "queued"):
            r = s.post(f"{url}/channel/ch1/broadcast", data=b'{"k": 2}', headers={**PUBLISH, "X-Broker-Message-ID": mid})
            assert r.status_code == 201, r.text
        [held] = s.post(f"{pull}/pull", json={"batch": 1}, headers=PULL).json()["Result"]
        assert held["Message"]["MessageID"] == "inflight"
        receiver.wait(lambda: len(receiver.at("/cb")) == 4, timeout=60, what="four push deliveries")
        # "a" and "b" have every job finished now (at the latest): their window passes 2 s later
        window_passed = time.monotonic() + 2.0

        def removed():
            return s.get(f"{url}/channel/ch1").json()["Footprint"]["RemovedByRetention"]["Messages"] >= 2

        assert wait_for(removed, timeout=WITHIN + 5, interval=0.5), cluster.output()[-3000:]
        took = time.monotonic() - window_passed
        print(f"removed {took:.1f} s after passing the window")
        assert took < WITHIN

        body = s.get(f"{url}/channel/ch1").json()
        assert body["Footprint"]["RemovedByRetention"] == {"Messages": 2, "Jobs": 4, "Transitions": 8,
                                                          "Attempts": 2}
        assert body["Footprint"]["RetentionLastRunAt"].endswith("Z")
        time.sleep(5.5)  # another loop period: the unfinished ones are still kept
        assert s.get(f"{url}/channel/ch1").json()["Footprint"]["RemovedByRetention"]["Messages"] == 2
        consumer = s.get(pull).json()
        assert (consumer["NumPending"], consumer["NumAckPending"], consumer["NumDelivered"]) == (1, 1, 0), consumer
        assert consumer["Footprint"]["RemovedByRetention"] == {"Jobs": 2, "Transitions": 4, "Attempts": 0}
        assert consumer["Footprint"]["OldestMessageAgeSeconds"] >= 2.0
        # a kept message is still there to finish: acking it works
        r = s.post(f"{pull}/ack", json={"Jobs": [{"ID": held["ID"], "NextState": "DELIVERED"}]}, headers=PULL)
        assert r.status_code == 200, r.text
        metrics = requests.get(f"{url}/metrics").text
        assert re.search(r'^broker_retention_removed_total\{channel="ch1",table="messages"\} 2(\.0)?$', metrics, re.MULTILINE)
        assert re.search(r'^broker_messages\{channel="ch1"\} 2(\.0)?$', metrics, re.MULTILINE)
    finally:
        cluster.stop()
        web.stop()
