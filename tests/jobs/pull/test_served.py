"""Pull consumers served by gunicorn (2 worker processes, threads) over real HTTP: many concurrent
pullers never hold one job at the same time and lose none; long-polls wait without a database
connection, count in NumWaiting across processes, and are woken at once by a publish."""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.processes import start_web, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = {"X-Broker-Admin-Token": ADMIN_TOKEN}
TOKENS = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "pt"}


def worker_kit(n: int) -> tuple[random.Random, requests.Session]:
    """A concurrent pull worker's own seeded random choices and its session with the tokens."""
    s = requests.Session()
    s.headers.update(TOKENS)
    return random.Random(n), s


def run_workers(worker, n: int) -> None:
    """``worker(0)`` ... ``worker(n - 1)`` in threads at once; returns when all are done (2 min at most)."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


@pytest.fixture
def web(tmp_path):
    proc = start_web(tmp_path, workers=2, threads=16, BROKER_CONNECTION_TIMEOUT=30, BROKER_PULL_WAIT_CONNECTIONS=2)
    try:
        s = requests.Session()
        assert s.put(f"{proc.url}/channel/ch", data={"token": "ct"}, headers=ADMIN).status_code == 200
        assert s.put(f"{proc.url}/producer/pr", data={"token": "prt"}, headers=ADMIN).status_code == 200
        assert s.put(f"{proc.url}/channel/ch/consumer/pc", data={"token": "pt", "type": "pull"},
                     headers=ADMIN).status_code == 200
        proc.base = f"{proc.url}/channel/ch/consumer/pc"
        yield proc
    finally:
        proc.stop()


def publish(url, n, prefix):
    """Batch publish through the API (one transaction, one NOTIFY per batch)."""
    headers = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "pr", "X-Broker-Producer-Token": "prt"}
    for start in range(0, n, 1000):
        batch = [{"MessageID": f"{prefix}{i}", "Payload": f"p{i}"} for i in range(start, min(n, start + 1000))]
        r = requests.post(f"{url}/channel/ch/messages", json=batch, headers=headers)
        assert r.status_code == 201, r.text


def stats(web):
    return requests.get(web.base, headers=TOKENS).json()


def test_concurrent_batch_pullers_never_share_a_job_and_lose_none(web):
    total = 3000
    publish(web.url, total, "m")
    held: dict[str, int] = {}
    delivered: set[str] = set()
    errors: list[str] = []
    lock = threading.Lock()
    nacks = [0]
    end = time.monotonic() + 90

    def worker(n):
        rng, s = worker_kit(n)
        while time.monotonic() < end:
            with lock:
                if len(delivered) >= total:
                    return
            r = s.post(f"{web.base}/pull", json={"batch": rng.randint(1, 60)})
            if r.status_code != 200:
                errors.append(f"pull {r.status_code} {r.text}")
                return
            jobs = r.json()["Result"]
            if not jobs:
                time.sleep(0.02)
                continue
            outcomes = []
            with lock:
                for job in jobs:
                    if job["ID"] in held:
                        errors.append(f"job {job['ID']} held by {held[job['ID']]} and {n}")
                    if job["ID"] in delivered:
                        errors.append(f"job {job['ID']} came back after delivery")
                    held[job["ID"]] = n
                for job in jobs:  # release before acking, so a redelivery can't race our bookkeeping
                    nack = rng.random() < 0.1
                    outcomes.append({"ID": job["ID"], "NextState": "QUEUED" if nack else "DELIVERED"})
                    del held[job["ID"]]
            result = s.post(f"{web.base}/ack", json={"Jobs": outcomes}).json()["Result"]
            with lock:
                for want, got in zip(outcomes, result):
                    if got.get("Error") or got["Status"] != want["NextState"]:
                        errors.append(f"ack {want} -> {got}")
                    if want["NextState"] == "DELIVERED":
                        delivered.add(want["ID"])
                    else:
                        nacks[0] += 1

    run_workers(worker, 8)
    assert not errors, errors[:10]
    assert len(delivered) == total
    s = stats(web)
    assert s["NumDelivered"] == total and s["NumPending"] == 0 and s["NumAckPending"] == 0
    assert nacks[0] > 0


def test_concurrent_spec_clients_claim_each_job_once(web):
    """Spec path with IncrementalTimeout on the claim: a lost race is a 400, so exactly one
    client gets the 202 for each job (without it, INFLIGHT -> INFLIGHT would also be a 202)."""
    total = 400
    publish(web.url, total, "s")
    wins: dict[str, int] = {}
    errors: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + 90

    def worker(n):
        rng, s = worker_kit(n)
        while time.monotonic() < end:
            listed = s.get(f"{web.base}/queued-jobs?limit=25").json()["Result"]
            if not listed:
                return
            rng.shuffle(listed)
            for job in listed[:5]:
                r = s.post(f"{web.base}/job/{job['ID']}", json={"NextState": "INFLIGHT", "IncrementalTimeout": 30})
                if r.status_code == 400:
                    continue
                if r.status_code != 202:
                    errors.append(f"claim {r.status_code}")
                    continue
                with lock:
                    if job["ID"] in wins:
                        errors.append(f"job {job['ID']} claimed by {wins[job['ID']]} and {n}")
                    wins[job["ID"]] = n
                r = s.post(f"{web.base}/job/{job['ID']}", json={"NextState": "DELIVERED"})
                if r.status_code != 202:
                    errors.append(f"deliver {r.status_code}")

    run_workers(worker, 6)
    assert not errors, errors[:10]
    assert len(wins) == total
    assert stats(web)["NumDelivered"] == total


def _connections(web) -> int:
    """The database's sessions, less each web process's LISTEN session (one per process, by design,
    opened by its first waiting pull: when every warm-up pull landed on one worker, the other's
    came in the middle of the test and counted as a waiter's, a failure in about one run of five)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name <> 'broker-listen'")
        return cur.fetchone()[0]


def test_long_polls_wait_without_connections_and_wake_on_publish(web):
    # warm up: every worker thread may keep a persistent connection from these
    for _ in range(20):
        requests.post(f"{web.base}/pull", json={"batch": 1, "expires": 0.2}, headers=TOKENS)
    before = _connections(web)
    waiters = 12
    results: list = [None] * waiters
    done_at: list = [None] * waiters

    def wait(i):
        r = requests.post(f"{web.base}/pull", json={"batch": 1, "expires": 30}, headers=TOKENS, timeout=60)
        done_at[i] = time.monotonic()
        results[i] = r

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(waiters)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 15
    while stats(web)["NumWaiting"] < waiters and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats(web)["NumWaiting"] == waiters  # counted across both worker processes
    time.sleep(0.5)
    during = _connections(web)
    # waiting pulls hold no connection beyond BROKER_PULL_WAIT_CONNECTIONS (2) per web process
    assert during - before <= 2 * 2, (before, during)
    published = time.monotonic()
    publish(web.url, waiters, "w")
    for t in threads:
        t.join(40)
    latencies = sorted(d - published for d in done_at)
    claimed = [r.json()["Result"] for r in results]
    assert all(r.status_code == 200 for r in results)
    ids = [job[0]["ID"] for job in claimed if job]
    assert len(ids) == waiters == len(set(ids))  # each waiter got its own job
    print(f"long-poll wake-up over HTTP: median {latencies[len(latencies) // 2] * 1000:.0f} ms, "
          f"max {latencies[-1] * 1000:.0f} ms")
    assert latencies[-1] < 4.5  # NOTIFY, not the 5 s safety net
    deadline = time.monotonic() + 5
    while stats(web)["NumWaiting"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats(web)["NumWaiting"] == 0


def _pull_then_hang_up(url: str, expires: float):
    """A long-poll pull sent on a raw socket (the caller closes it: a client that gave up)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"batch": 1, "expires": expires}).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(f"POST /channel/ch/consumer/pc/pull HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
                 + b"Content-Type: application/json\r\n"
                 + "".join(f"{k}: {v}\r\n" for k, v in TOKENS.items()).encode()
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_abandoned_long_polls_claim_nothing(web):
    """Issue 23: four pulls wait, their clients hang up; one publish: the woken pulls claim nothing and
    leave the waiting list, and a live pull gets the job at once (not after the lease of a job claimed
    for a client that is gone)."""
    socks = [_pull_then_hang_up(web.url, 30) for _ in range(4)]
    assert wait_for(lambda: stats(web)["NumWaiting"] == 4, 10), stats(web)
    for sock in socks:
        sock.close()
    live: list = []
    started = threading.Event()

    def live_pull():
        started.set()
        live.append(requests.post(f"{web.base}/pull", json={"batch": 1, "expires": 20}, headers=TOKENS, timeout=30))

    thread = threading.Thread(target=live_pull)
    thread.start()
    started.wait()
    time.sleep(0.5)  # the live pull is waiting beside the abandoned ones
    t0 = time.monotonic()
    publish(web.url, 1, "abandoned")
    thread.join(25)
    took = time.monotonic() - t0
    jobs = live[0].json()["Result"]
    assert [j["Message"]["MessageID"] for j in jobs] == ["abandoned0"] and jobs[0]["Attempt"] == 1, jobs
    assert took < 3.0, f"the live pull got the job after {took:.1f} s"
    assert wait_for(lambda: stats(web)["NumWaiting"] == 0, 10), stats(web)  # the abandoned ones left
    assert stats(web)["NumAckPending"] == 1  # only the live pull's claim is in flight
