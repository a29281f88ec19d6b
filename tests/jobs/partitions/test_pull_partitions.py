"""Partitions with pull consumers: gating, handler-driven gate moves by ack, manual checkpoint,
close and auto-close, advisories, publish refusals. All over HTTP."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from broker.xid import job_pk
from jobs.models import Job, JobStatus, JobTransition, Partition
from jobs.ops.partition_actions import partition_write
from jobs.partitions.settle import partitions_settle_stale
from tests.jobs.partitions.conftest import advisories

pytestmark = pytest.mark.django_db(transaction=True)


def pull_ids(pc, batch=20):
    r = pc.pull(batch=batch, no_wait=True)
    assert r.status_code == 200, r.content
    return r.json()["Result"]


def ack(pc, jobs):
    r = pc.ack(jobs)
    assert r.status_code == 200, r.content
    return r.json()["Result"]


def test_only_the_current_gate_is_pulled_and_it_advances_when_all_are_delivered(pull_world, parts, pc):
    for i in range(3):
        assert parts.publish("k1", 0, body=f'{{"item": {i}}}'.encode()).status_code == 201
    assert parts.publish("k1", 1, body=b'{"summary": true}').status_code == 201
    assert parts.publish("k1", 0, body=b'{"item": 3}').status_code == 201  # gate 0 still open
    got = pull_ids(pc)
    assert [j["Gate"] for j in got] == [0, 0, 0, 0] and {j["PartitionKey"] for j in got} == {"k1"}
    assert pull_ids(pc) == []
    ack(pc, [{"ID": j["ID"], "NextState": "DELIVERED"} for j in got[:3]])
    assert pull_ids(pc) == []  # one gate-0 job still in flight
    ack(pc, [{"ID": got[3]["ID"], "NextState": "DELIVERED"}])
    [summary] = pull_ids(pc)
    assert summary["Gate"] == 1 and json.loads(summary["Message"]["Payload"]) == {"summary": True}
    p = parts.get("c2", "k1")
    assert p["gate"] == 1 and p["status"] == "AVAILABLE"
    assert p["counts"] == {"0": {"DELIVERED": 4}, "1": {"INFLIGHT": 1}}
    # non-partitioned traffic is untouched
    assert pull_world.publish().status_code == 201
    [plain] = pull_ids(pc)
    assert "PartitionKey" not in plain


def test_ack_moves_a_job_to_a_later_gate_with_a_new_payload(pull_world, parts, pc, api):
    parts.publish("doc", 0, body=b'{"step": "ocr"}')
    parts.publish("doc-other", 0, body=b'{"x": 1}')
    jobs = {j["PartitionKey"]: j for j in pull_ids(pc)}
    job = jobs["doc"]
    [res] = ack(pc, [{"ID": job["ID"], "NextState": "QUEUED", "Gate": 3, "Payload": {"step": "rank"}}])
    assert res == {"ID": job["ID"], "Status": "QUEUED", "Gate": 3}
    [again] = pull_ids(pc)
    assert again["ID"] == job["ID"] and again["Gate"] == 3
    assert json.loads(again["Message"]["Payload"]) == {"step": "rank"}
    # a gate not above the current one is a conflict, the job stays in flight
    [bad] = ack(pc, [{"ID": again["ID"], "NextState": "QUEUED", "Gate": 3}])
    assert bad["Error"] == "conflict" and bad["Status"] == "INFLIGHT"
    # a plain (non-partitioned) job cannot move gates
    pull_world.publish()
    [plain] = pull_ids(pc)
    [bad] = ack(pc, [{"ID": plain["ID"], "NextState": "QUEUED", "Gate": 1}])
    assert bad["Error"] == "conflict"
    r = pc.ack([{"ID": plain["ID"], "NextState": "DELIVERED", "Gate": 1}])
    assert r.status_code == 400 and r.json()["error"] == "invalid_gate"
    r = pc.ack([{"ID": plain["ID"], "NextState": "QUEUED", "Gate": -1}])
    assert r.status_code == 400
    ack(pc, [{"ID": again["ID"], "NextState": "DELIVERED"}])
    assert JobTransition.objects.filter(job_id=job_pk(job["ID"]), reason="gate").count() == 1
    # the other consumer's copy keeps its payload: the override is per job
    assert Job.objects.get(pk=job_pk(job["ID"])).payload is not None
    p = parts.get("c2", "doc")
    assert p["gate"] == 3 and p["counts"] == {"3": {"DELIVERED": 1}}


def test_manual_checkpoint_waits_for_advance(pull_world, parts, pc):
    parts.publish("m", 0)
    parts.patch("c2", "m", manualCheckpoint=True)
    parts.publish("m", 1)
    [a] = pull_ids(pc)
    assert parts.post("c2", "m", "advance", expect=409)["error"] == "gate_not_finished"
    ack(pc, [{"ID": a["ID"], "NextState": "DELIVERED"}])
    assert pull_ids(pc) == []
    assert parts.get("c2", "m")["gate"] == 0
    body = parts.post("c2", "m", "advance")
    assert body["gate"] == 1
    [b] = pull_ids(pc)
    assert b["Gate"] == 1
    ack(pc, [{"ID": b["ID"], "NextState": "DELIVERED"}])
    assert parts.post("c2", "m", "advance", expect=409)["error"] == "no_next_gate"


def test_close_and_auto_close_complete_with_advisories(pull_world, parts, pc, api, settings):
    # close: complete once everything is delivered; later publishes refused
    parts.publish("c", 0)
    [a] = pull_ids(pc)
    ack(pc, [{"ID": a["ID"], "NextState": "DELIVERED"}])
    assert parts.get("c2", "c")["status"] == "AVAILABLE"  # not closed: more may come
    body = parts.post("c2", "c", "close")
    assert body["status"] == "COMPLETE" and body["closed"] is True
    r = parts.publish("c", 0)
    assert r.status_code == 409 and r.json()["error"] == "partition_closed"
    # auto-close: complete as soon as all jobs are delivered; a new publish reopens it
    parts.publish("auto", 0)
    parts.patch("c2", "auto", autoClose=True)
    [b] = pull_ids(pc)
    ack(pc, [{"ID": b["ID"], "NextState": "DELIVERED"}])
    assert parts.get("c2", "auto")["status"] == "COMPLETE"
    assert parts.publish("auto", 1).status_code == 201
    p = parts.get("c2", "auto")
    assert p["status"] == "AVAILABLE" and p["gate"] == 1
    [c] = pull_ids(pc)
    ack(pc, [{"ID": c["ID"], "NextState": "DELIVERED"}])
    complete = [a for a in advisories(api, "c2") if a["type"] == "partition_complete"]
    assert [(a["key"], a["consumer"], a["counts"]["DELIVERED"]) for a in complete] == [
        ("c", "c2", 1), ("auto", "c2", 1), ("auto", "c2", 2)]
    # listing by status
    r = api.get("/channel/ch1/consumer/c2/partitions?status=COMPLETE")
    assert r.status_code == 200 and sorted(p["key"] for p in r.json()["Result"]) == ["auto", "c"]
    assert api.get("/channel/ch1/consumer/c2/partitions?status=NOPE").status_code == 400


def test_dead_job_fails_the_partition_until_retried_or_skipped(pull_world, parts, pc, api):
    parts.publish("f", 0, body=b'{"n": 1}')
    parts.publish("f", 0, body=b'{"n": 2}')
    parts.publish("f", 1, body=b'{"n": 3}')
    a, b = pull_ids(pc)
    ack(pc, [{"ID": a["ID"], "NextState": "DEAD"}, {"ID": b["ID"], "NextState": "DELIVERED"}])
    p = parts.get("c2", "f")
    assert p["status"] == "FAILED" and p["gate"] == 0
    assert pull_ids(pc) == []  # gate 1 blocked
    [failed] = [x for x in advisories(api, "c2") if x["type"] == "partition_failed"]
    assert failed["key"] == "f" and failed["counts"]["DEAD"] == 1
    body = parts.post("c2", "f", "retry")
    assert body["requeued"] == 1 and body["status"] == "AVAILABLE"
    [again] = pull_ids(pc)
    assert again["ID"] == a["ID"]
    ack(pc, [{"ID": again["ID"], "NextState": "DEAD"}])
    assert parts.get("c2", "f")["status"] == "FAILED"
    # the DLQ requeue also resumes it
    r = pc.requeue(again["ID"])
    assert r.status_code in (200, 202, 204), r.content
    assert parts.get("c2", "f")["status"] == "AVAILABLE"
    [again] = pull_ids(pc)
    ack(pc, [{"ID": again["ID"], "NextState": "DEAD"}])
    body = parts.post("c2", "f", "skip")
    assert body["skipped"] == 1 and body["status"] == "AVAILABLE" and body["gate"] == 1
    [c] = pull_ids(pc)
    assert json.loads(c["Message"]["Payload"]) == {"n": 3}


def test_publish_refusals_and_key_encoding(pull_world, parts, pc, api):
    r = parts.publish("x" * 256)
    assert r.status_code == 400 and r.json()["error"] == "invalid_partition_key"
    for bad in ("-1", "x", "1.5"):
        r = parts.publish("k", bad)
        assert r.status_code == 400 and r.json()["error"] == "invalid_gate", bad
    r = pull_world.publish(HTTP_X_BROKER_GATE="1")
    assert r.status_code == 400
    key = "tenant/a b?#%é"
    assert parts.publish(key, 1).status_code == 201
    assert parts.get("c2", key)["gate"] == 1
    r = parts.publish(key, 0, HTTP_X_BROKER_MESSAGE_ID="too-low")
    assert r.status_code == 409 and r.json()["error"] == "gate_passed"
    assert not Job.objects.filter(message__message_id="too-low").exists()  # nothing stored
    assert api.get(parts.url("c2", "nope")).status_code == 404
    assert api.post(parts.url("c2", "nope", "close")).status_code == 404
    # consumer tokens work, wrong ones are refused
    from rest_framework.test import APIClient

    c = APIClient()
    assert c.get(parts.url("c2", key)).status_code == 401
    assert c.get(parts.url("c2", key), HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                 HTTP_X_BROKER_CONSUMER_TOKEN="c2-token").status_code == 200
    assert c.get(parts.url("c2", key), HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                 HTTP_X_BROKER_CONSUMER_TOKEN="bad").status_code == 403
    # batch publish: the request's headers apply to every message
    r = api.generic("POST", "/channel/ch1/messages", json.dumps([{"Payload": {"i": 1}}, {"Payload": {"i": 2}}]),
                    content_type="application/json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                    HTTP_X_BROKER_PRODUCER_ID="p1", HTTP_X_BROKER_PRODUCER_TOKEN="p-token",
                    HTTP_X_BROKER_PARTITION_KEY="batch", HTTP_X_BROKER_GATE="2")
    assert r.status_code == 201, r.content
    assert parts.get("c2", "batch")["counts"] == {"2": {"QUEUED": 2}}
    assert Partition.objects.filter(key="batch").count() == 1


def test_ordered_consumer_hands_out_one_job_per_partition_in_order(make, parts, pc, api):
    make.channel()
    make.producer()
    make.consumer("c2", type="pull", token="c2-token", callback=None, ordered="true")
    assert api.get("/channel/ch1/consumer/c2").json()["Ordered"] is True
    for i in range(3):
        parts.publish("o1", 0, body=f'{{"i": {i}}}'.encode())
        parts.publish("o2", 0, body=f'{{"i": {i}}}'.encode())
    seen = []
    for _ in range(3):
        got = pull_ids(pc)
        assert sorted(j["PartitionKey"] for j in got) == ["o1", "o2"]
        seen.append([json.loads(j["Message"]["Payload"])["i"] for j in got])
        assert pull_ids(pc) == []
        ack(pc, [{"ID": j["ID"], "NextState": "DELIVERED"} for j in got])
    assert seen == [[0, 0], [1, 1], [2, 2]]
    assert Job.objects.filter(status=JobStatus.DELIVERED).count() == 6


def test_a_waiting_pull_is_woken_when_the_gate_advances(pull_world, parts, pc):
    import threading

    from rest_framework.test import APIClient

    from tests.jobs.pull.conftest import PullClient

    parts.publish("w", 0)
    parts.publish("w", 1, body=b'{"next": true}')
    [a] = pull_ids(pc)
    result = {}

    def waiting():
        from django.db import connection

        t0 = time.monotonic()
        r = PullClient(APIClient()).pull(batch=1, expires=10)
        result["jobs"], result["waited"] = r.json()["Result"], time.monotonic() - t0
        connection.close()

    t = threading.Thread(target=waiting)
    t.start()
    time.sleep(0.5)
    ack(pc, [{"ID": a["ID"], "NextState": "DELIVERED"}])
    t.join(timeout=15)
    [b] = result["jobs"]
    assert b["Gate"] == 1 and result["waited"] < 8


def settle_lose(parts, pc, key: str = "lost") -> Partition:
    """A partition whose gate 0 is done but whose settle was lost to a crash: put back at gate 0,
    as if never settled, 10 s ago (so the safety net considers it)."""

    parts.publish(key, 0)
    parts.publish(key, 1)
    [a] = pull_ids(pc)
    ack(pc, [{"ID": a["ID"], "NextState": "DELIVERED"}])
    p = Partition.objects.get(key=key)
    assert partition_write(partition_pk=p.pk, version=p.version, gate=0)
    Partition.objects.filter(pk=p.pk).update(updated_at=p.updated_at - timedelta(seconds=10))
    assert pull_ids(pc) == []
    return p


def test_safety_net_settles_a_partition_whose_settle_was_lost(pull_world, parts, pc):

    settle_lose(parts, pc)
    assert partitions_settle_stale(force=True) == 1
    [b] = pull_ids(pc)
    assert b["Gate"] == 1


def test_batch_items_carry_their_own_partition_and_gate(pull_world, parts, pc, api):
    def batch(items, **headers):
        return api.generic("POST", "/channel/ch1/messages", json.dumps(items), content_type="application/json",
                           HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_PRODUCER_ID="p1",
                           HTTP_X_BROKER_PRODUCER_TOKEN="p-token", **headers)

    r = batch([{"Payload": {"i": 0}, "PartitionKey": "b1"}, {"Payload": {"i": 1}, "PartitionKey": "b1", "Gate": 1},
               {"Payload": {"i": 2}, "PartitionKey": "b2", "Gate": 4}, {"Payload": {"plain": True}}])
    assert r.status_code == 201, r.content
    assert parts.get("c2", "b1")["counts"] == {"0": {"QUEUED": 1}, "1": {"QUEUED": 1}}
    assert parts.get("c2", "b2")["gate"] == 4
    got = pull_ids(pc)
    assert sorted((j.get("PartitionKey"), j.get("Gate")) for j in got if j.get("PartitionKey")) == [
        ("b1", 0), ("b2", 4)]
    assert sum(1 for j in got if "PartitionKey" not in j) == 1
    for bad in ({"Gate": -1, "PartitionKey": "b"}, {"Gate": "1", "PartitionKey": "b"}, {"Gate": 1},
                {"PartitionKey": 7}, {"PartitionKey": "x" * 256}, {"Gate": "²", "PartitionKey": "b"}):
        r = batch([{"Payload": {"i": 9}, **bad}])
        assert r.status_code == 400, (bad, r.content)
    r = batch([{"Payload": {"i": 9}, "PartitionKey": "b2", "Gate": 3}])  # below b2's gate: whole batch refused
    assert r.status_code == 409 and r.json()["error"] == "gate_passed"
    r = pull_world.publish(HTTP_X_BROKER_PARTITION_KEY="h", HTTP_X_BROKER_GATE="²")
    assert r.status_code == 400


def test_spec_job_endpoint_moves_a_job_to_a_later_gate(pull_world, parts, pc):
    parts.publish("s", 0, body=b'{"v": 0}')
    [a] = pull_ids(pc)
    r = pc.set_state(a["ID"], {"NextState": "QUEUED", "Gate": 2, "Payload": "plain text"})
    assert r.status_code == 202, r.content
    [b] = pull_ids(pc)
    assert b["ID"] == a["ID"] and b["Gate"] == 2 and b["Message"]["Payload"] == "plain text"
    r = pc.set_state(a["ID"], {"NextState": "QUEUED", "Gate": 1})
    assert r.status_code == 400 and r.json()["error"] == "invalid_transition"
    r = pc.set_state(a["ID"], {"NextState": "QUEUED", "Gate": "x"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_gate"
    assert pc.set_state("999999", {"NextState": "QUEUED", "Gate": 3}).status_code == 404
    assert pc.set_state(a["ID"], {"NextState": "DELIVERED"}).status_code == 202
    assert parts.get("c2", "s")["counts"] == {"2": {"DELIVERED": 1}}


def test_completion_is_published_to_the_advisory_channel(pull_world, parts, pc, make, settings):
    from rest_framework.test import APIClient

    from tests.jobs.pull.conftest import PullClient

    make.channel("adv", token="adv-token")
    make.consumer("fanin", channel="adv", type="pull", token="fanin-token", callback=None)
    settings.BROKER_ADVISORY_CHANNEL = "adv"
    parts.publish("job-42", 0)
    parts.patch("c2", "job-42", autoClose=True)
    [a] = pull_ids(pc)
    ack(pc, [{"ID": a["ID"], "NextState": "DELIVERED"}])
    fanin = PullClient(APIClient(), base="/channel/adv/consumer/fanin",
                       headers={"HTTP_X_BROKER_CHANNEL_TOKEN": "adv-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "fanin-token"})
    [msg] = fanin.pull(batch=5, no_wait=True).json()["Result"]
    body = json.loads(msg["Message"]["Payload"])
    assert body["type"] == "partition_complete" and body["key"] == "job-42" and body["consumer"] == "c2"
    assert body["channel"] == "ch1" and body["counts"]["DELIVERED"] == 1
