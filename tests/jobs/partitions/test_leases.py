"""Leases under concurrency: three workers on 50 partitions, a SIGKILLed worker's partitions
taken over after its lease, and optimistic concurrency under many threads."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection

from jobs.models import Job, JobStatus, Partition
from jobs.ops.partition_actions import partition_write
from jobs.partitions.leases import partition_leases_cycle
from jobs.partitions.rows import COMPLETE
from jobs.partitions.settle import partition_settle
from tests.jobs.conftest import Reply
from tests.jobs.partitions.conftest import LEASE
from tests.jobs.partitions.test_push_partitions import partition_owner, wait_for
from tests.processes import ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)


def batch_publish(api, key, gate, items):
    r = api.generic("POST", "/channel/ch1/messages", json.dumps([{"Payload": i} for i in items]),
                    content_type="application/json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                    HTTP_X_BROKER_PRODUCER_ID="p1", HTTP_X_BROKER_PRODUCER_TOKEN="p-token",
                    HTTP_X_BROKER_PARTITION_KEY=key, HTTP_X_BROKER_GATE=str(gate))
    assert r.status_code == 201, r.content


def test_three_workers_on_fifty_partitions(make, parts, receiver, dispatcher, part_settings, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), ordered="true")
    deliveries = []  # (key, worker header, (db owner, live), start, end)
    lock = threading.Lock()

    def reply(n, request):
        key = request.headers["x-broker-partition-key"]
        start = time.monotonic()
        owner = partition_owner("c1", key)
        time.sleep(0.02)
        with lock:
            deliveries.append((key, request.headers["x-broker-lease-owner"], owner, start, time.monotonic()))
        return Reply(204)

    receiver.behave("/cb", reply)
    workers = [dispatcher(concurrency=8) for _ in range(3)]
    keys = [f"p{i:02d}" for i in range(50)]
    for key in keys:
        batch_publish(api, key, 0, [{"k": key, "i": i} for i in range(3)])
        batch_publish(api, key, 1, [{"k": key, "summary": True}])
        parts.post("c1", key, "close")
    wait_for(lambda: Partition.objects.filter(status=COMPLETE).count() == 50, timeout=90,
             what="50 partitions complete")
    assert Job.objects.filter(status=JobStatus.DELIVERED).count() == 200
    assert len(deliveries) == 200  # each job exactly once: nothing handed out twice
    per_key = defaultdict(list)
    for key, worker, (owner, live), start, end in deliveries:
        assert owner == worker, f"{key} delivered by {worker} while {owner} held the lease"
        per_key[key].append((start, end, worker))
    for key, spans in per_key.items():
        spans.sort()
        for (s1, e1, w1), (s2, e2, w2) in zip(spans, spans[1:]):
            assert s2 >= e1 - 0.005, f"{key}: ordered consumer had two jobs in flight"
    ids = {d.engine.worker_id for d in workers}
    used = Counter(w for _, w, *_ in deliveries)
    assert set(used) <= ids
    print("deliveries per worker:", sorted(used.values()))
    assert len(used) >= 2, used  # leases were spread (fair share / stealing)


KILLED_WORKER = """
import os, sys, django
sys.path.insert(0, {root!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
django.setup()
from jobs.push.dispatcher import Engine
e = Engine(concurrency=8)
print("WORKER", e.worker_id, flush=True)
e.run(claim_for=600, drain_for=1)
"""


def test_killed_worker_partitions_are_taken_after_the_lease(make, parts, receiver, dispatcher, part_settings,
                                                            api, tmp_path):
    import subprocess

    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), connectionTimeout="1")
    hang = threading.Event()
    hang.set()
    log = []

    def reply(n, request):
        worker = request.headers["x-broker-lease-owner"]
        log.append((request.headers["x-broker-partition-key"], worker, partition_owner("c1", request.headers[
            "x-broker-partition-key"])))
        if hang.is_set():
            return Reply(204, delay=5.0)  # the first worker dies while these are in flight
        return Reply(204)

    receiver.behave("/cb", reply)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        batch_publish(api, key, 0, [{"i": i} for i in range(2)])
        batch_publish(api, key, 1, [{"summary": True}])
        parts.post("c1", key, "close")
    env = child_env(BROKER_PARTITION_LEASE_SECONDS=str(LEASE), BROKER_PUSH_POLL="0.2", BROKER_RATIONAL_DELAY="0.5",
                    BROKER_CONNECTION_TIMEOUT="1", BROKER_RETRY_BACKOFF="0.5,1")
    logf = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WORKER.format(root=str(ROOT))], env=env,
                            stdout=subprocess.PIPE, stderr=logf, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("WORKER"), (tmp_path / "worker.log").read_text()
        dead_id = line.split()[1]
        wait_for(lambda: Partition.objects.filter(owner=dead_id).count() == 5 and len(log) >= 5, timeout=30,
                 what="the first worker leasing all five partitions and delivering")
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        logf.close()
    hang.clear()
    killed_at = time.monotonic()
    survivor = dispatcher()
    wait_for(lambda: Partition.objects.filter(status=COMPLETE).count() == 5, timeout=60,
             what="the survivor completing the five partitions")
    assert time.monotonic() - killed_at >= 0.5  # not before the lease / in-flight deadlines ran out
    after = [entry for entry in log if entry[1] == survivor.engine.worker_id]
    assert {k for k, *_ in after} == set(keys)
    for key, worker, (owner, live) in after:
        assert owner == worker
    assert Job.objects.filter(status=JobStatus.DELIVERED).count() == 15


def test_versions_never_lose_an_update_under_concurrent_writers(make, parts, api, part_settings):
    """Many threads write one partition at once: flag writers (read, then write with the version
    check, retrying lost races), lease cycles of several workers with a very short lease (renew,
    expire, take, steal) and settles. Every successful write must have produced a distinct version,
    and together exactly start+1 .. final: no write was lost or applied twice."""
    make.channel()
    make.producer()
    make.consumer("c1", callback="http://127.0.0.1:9/cb")
    for i in range(6):
        parts.publish(f"v{i}", 0)
    target = Partition.objects.get(key="v0")
    start = target.version
    writes = []  # new versions of the target written by anyone
    flips = Counter()
    errors = []
    lock = threading.Lock()

    def flip(n):
        try:
            for _ in range(n):
                while True:
                    checkpoint, version = Partition.objects.values_list("manual_checkpoint", "version").get(
                        pk=target.pk)
                    new = partition_write(partition_pk=target.pk, version=version,
                                                     manual_checkpoint=not checkpoint)
                    if new is not None:
                        with lock:
                            writes.append(new)
                            flips["n"] += 1
                        break
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    def lease(worker):
        try:
            for _ in range(20):
                cycle = partition_leases_cycle(worker=worker, lease=0.05)
                settled = partition_settle(partition_pk=target.pk)
                with lock:
                    writes.extend(v for pk, v in cycle.writes if pk == target.pk)
                    if settled is not None and settled.changed:
                        writes.append(settled.version)
                time.sleep(0.005)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=flip, args=(25,)) for _ in range(6)]
    threads += [threading.Thread(target=lease, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    final = Partition.objects.get(pk=target.pk)
    assert flips["n"] == 150
    assert final.manual_checkpoint is False  # 150 flips: back where it started, none lost
    assert sorted(writes) == list(range(start + 1, final.version + 1)), "a write was lost or doubled"
    assert len(writes) > 150  # the lease cycles wrote too
