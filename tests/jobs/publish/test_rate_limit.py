"""Producer rate limit: a token bucket in PostgreSQL, one conditional UPDATE per publish, holding
across processes (two gunicorn servers share one limit)."""

from __future__ import annotations

import threading

import pytest
import requests

from broker.models import Message
from tests.conftest import ADMIN_TOKEN
from tests.processes import start_web

pytestmark = pytest.mark.django_db(transaction=True)


def test_rate_limit_in_process(make, api):
    make.channel()
    r = api.put("/producer/p1", {"token": "p-token", "rateLimitPerSecond": "0.01", "burst": "3"})
    assert r.status_code == 200, r.content
    assert (r.json()["RateLimitPerSecond"], r.json()["Burst"]) == (0.01, 3)
    assert api.get("/producer/p1").json()["Burst"] == 3
    make.consumer("c1", type="pull", callback=None)
    codes = [make.publish().status_code for _ in range(5)]
    assert codes == [201, 201, 201, 429, 429]
    r = make.publish()
    assert r.json()["error"] == "rate_limited" and int(r["Retry-After"]) >= 1
    assert Message.objects.count() == 3
    # lifting the limit (0) lets it publish again
    since = api.get("/producer/p1")["Last-Modified"]
    r = api.put("/producer/p1", {"rateLimitPerSecond": "0"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200 and r.json()["RateLimitPerSecond"] is None
    assert make.publish().status_code == 201


def test_unlimited_producer_and_bad_input(make, api):
    make.channel()
    make.producer()
    assert api.get("/producer/p1").json()["RateLimitPerSecond"] is None
    for _ in range(10):
        assert make.publish().status_code == 201
    r = api.put("/producer/p2", {"token": "t", "rateLimitPerSecond": "fast"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_rateLimitPerSecond"
    r = api.put("/producer/p2", {"token": "t", "burst": "0"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_burst"


def test_rate_limit_holds_across_two_server_processes(tmp_path):
    web1 = start_web(tmp_path, workers=1, threads=4)
    web2 = start_web(tmp_path, workers=1, threads=4)
    try:
        admin = {"X-Broker-Admin-Token": ADMIN_TOKEN}
        assert requests.put(f"{web1.url}/channel/rl", data={"token": "ct"}, headers=admin).status_code == 200
        r = requests.put(f"{web2.url}/producer/rp", data={"token": "pt", "rateLimitPerSecond": "0.001",
                                                          "burst": "10"}, headers=admin)
        assert r.status_code == 200, r.text
        headers = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "rp", "X-Broker-Producer-Token": "pt",
                   "Content-Type": "text/plain"}
        codes: list[int] = []
        lock = threading.Lock()

        def worker(url):
            with requests.Session() as s:
                for _ in range(8):
                    code = s.post(f"{url}/channel/rl/broadcast", data=b"x", headers=headers, timeout=30).status_code
                    with lock:
                        codes.append(code)

        threads = [threading.Thread(target=worker, args=(u,)) for u in (web1.url, web2.url) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(codes) <= {201, 429}, codes
        assert codes.count(201) == 10, codes  # the burst, shared by both processes (refill ~0 in the test)
        assert Message.objects.filter(channel__channel_id="rl").count() == 10
    finally:
        web1.stop()
        web2.stop()
