"""The batch ack and progress (jobs.pull.ack): per-job answers, negative acknowledgements past the
retry limit, validation, deadline extensions."""

from __future__ import annotations

import json
import time

import pytest

from broker import xid
from broker.xid import job_pk, job_xid
from jobs.sweeps.inflight_timeout import jobs_expire_inflight
from tests.jobs.pull.conftest import bulk_publish, job_status, publish_n, pull_one_short_deadline

pytestmark = pytest.mark.django_db


def test_ack_answers_per_job(world, pc, make):
    make.consumer("c3", type="pull", token="c3-token", callback=None)
    publish_n(world, 6)
    ids = [j["ID"] for j in pc.pull(batch=4).json()["Result"]]
    queued = pc.queued().json()["Result"][0]["ID"]
    from jobs.models import Job

    foreign = job_xid(Job.objects.filter(consumer__consumer_id="c3").first().pk)
    # job IDs are xids: the integer key of a job in flight, or its xid with other check bytes,
    # names no job
    integer = str(job_pk(ids[0]))
    wrong_check = xid._encode_int((xid._check(job_pk(ids[0])) ^ 1) << 64 | job_pk(ids[0]))
    r = pc.ack([
        {"ID": ids[0], "NextState": "DELIVERED"},
        {"ID": ids[1], "NextState": "DEAD"},
        {"ID": ids[2], "NextState": "QUEUED"},
        {"ID": ids[3], "NextState": "QUEUED", "Delay": 30},
        {"ID": queued, "NextState": "DELIVERED"},
        {"ID": foreign, "NextState": "DELIVERED"},
        {"ID": "123456789", "NextState": "DELIVERED"},
        {"ID": "not-a-number", "NextState": "DEAD"},
        {"ID": integer, "NextState": "DELIVERED"},
        {"ID": wrong_check, "NextState": "DELIVERED"},
    ])
    assert r.status_code == 200, r.content
    result = r.json()["Result"]
    assert [x["ID"] for x in result] == [ids[0], ids[1], ids[2], ids[3], queued, foreign, "123456789", "not-a-number",
                                         integer, wrong_check]
    assert result[0] == {"ID": ids[0], "Status": "DELIVERED", "RetryCount": 0}
    assert result[1] == {"ID": ids[1], "Status": "DEAD", "RetryCount": 0}
    assert result[2] == {"ID": ids[2], "Status": "QUEUED", "RetryCount": 1}
    assert result[3] == {"ID": ids[3], "Status": "QUEUED", "RetryCount": 1}
    assert result[4]["Error"] == "conflict" and result[4]["Status"] == "QUEUED"
    assert [x["Error"] for x in result[5:]] == ["not_found"] * 5
    assert job_status(foreign) == ("QUEUED", 0)
    # the nacked job without delay comes back at once, with its attempt number; the delayed one later
    nexts = pc.pull(batch=10).json()["Result"]
    by_id = {j["ID"]: j for j in nexts}
    assert ids[2] in by_id and by_id[ids[2]]["Attempt"] == 2 and ids[3] not in by_id


def test_nack_past_the_retry_limit_is_dead(world, pc, api):
    api.put("/channel/ch1/consumer/c2", {"maxRetry": 1}, HTTP_IF_UNMODIFIED_SINCE=api.get(
        "/channel/ch1/consumer/c2").headers["Last-Modified"])
    publish_n(world, 1)
    jid = pc.pull().json()["Result"][0]["ID"]
    assert pc.ack([{"ID": jid, "NextState": "QUEUED"}]).json()["Result"][0]["Status"] == "QUEUED"
    assert pc.pull().json()["Result"][0]["ID"] == jid
    assert pc.ack([{"ID": jid, "NextState": "QUEUED"}]).json()["Result"][0] == {"ID": jid, "Status": "DEAD",
                                                                                "RetryCount": 2}


def test_delivered_never_comes_back(world, pc):
    publish_n(world, 2)
    ids = [j["ID"] for j in pc.pull(batch=2).json()["Result"]]
    pc.ack([{"ID": i, "NextState": "DELIVERED"} for i in ids])
    assert pc.ack([{"ID": ids[0], "NextState": "QUEUED"}]).json()["Result"][0]["Error"] == "conflict"
    assert pc.set_state(ids[0], {"NextState": "INFLIGHT"}).status_code == 400
    assert pc.requeue(ids[0]).status_code == 400
    assert jobs_expire_inflight() == 0
    assert pc.pull(batch=10).json() == {"Result": []}
    assert [job_status(i) for i in ids] == [("DELIVERED", 0)] * 2


@pytest.mark.parametrize("raw, code", [
    ("{bad", 400), ("[]", 400), ('{"Jobs": []}', 400), ('{"Jobs": {}}', 400), ('{"Jobs": [1]}', 400),
    ('{"Jobs": [{"ID": "1"}]}', 400), ('{"Jobs": [{"ID": "1", "NextState": "INFLIGHT"}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "DELIVERED", "Delay": 5}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "QUEUED", "Delay": -5}]}', 400),
    ('{"Jobs": [{"ID": null, "NextState": "DEAD"}]}', 400),
    ('{"Jobs": [{"ID": "1", "NextState": "DEAD"}, {"ID": "1", "NextState": "DELIVERED"}]}', 400),
    # the same job twice (its job ID is the one spelling of it)
    (json.dumps({"Jobs": [{"ID": job_xid(1), "NextState": "DEAD"}, {"ID": job_xid(1), "NextState": "QUEUED"}]}), 400),
    (json.dumps({"Jobs": [{"ID": str(i), "NextState": "DEAD"} for i in range(1001)]}), 413),
])
def test_ack_validation(world, pc, raw, code):
    r = pc.ack(None, raw=raw)
    assert r.status_code == code, r.content
    assert "error" in r.json()


def test_ack_of_a_thousand_jobs(world, pc):
    bulk_publish(1000)
    ids = [j["ID"] for j in pc.pull(batch=1000).json()["Result"]]
    assert len(ids) == 1000
    result = pc.ack([{"ID": i, "NextState": "DELIVERED"} for i in ids]).json()["Result"]
    assert all(x["Status"] == "DELIVERED" and "Error" not in x for x in result)
    assert pc.stats()["NumDelivered"] == 1000


def test_progress_extends_the_deadline_without_a_retry(world, pc, settings):
    from jobs.models import Job

    settings.BROKER_CONNECTION_TIMEOUT = 1.0
    settings.BROKER_RATIONAL_DELAY = 0.5
    publish_n(world, 2)
    jid = pc.pull().json()["Result"][0]["ID"]
    before = Job.objects.get(pk=job_pk(jid)).deadline
    r = pc.progress(jid, IncrementalTimeout=100)
    assert r.status_code == 200, r.content
    assert r.json()["ID"] == jid
    job = Job.objects.get(pk=job_pk(jid))
    assert (job.deadline - before).total_seconds() > 99 and job.retry_count == 0 and job.incremental_timeout == 100
    assert r.json()["Status"] == "INFLIGHT" and r.json()["RetryCount"] == 0
    # never shortens
    assert pc.progress(jid, IncrementalTimeout=1).status_code == 200
    assert Job.objects.get(pk=job_pk(jid)).deadline == job.deadline
    # not in flight: 409; another consumer's / unknown: 404
    queued = pc.queued().json()["Result"][0]["ID"]
    assert pc.progress(queued).status_code == 409
    assert pc.progress("99999999").status_code == 404
    assert pc.progress(jid, IncrementalTimeout=-1).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_progress_keeps_a_job_from_timing_out(world, pc, settings):
    jid = pull_one_short_deadline(world, pc, settings)
    for _ in range(3):
        time.sleep(0.4)
        assert pc.progress(jid).status_code == 200
    jobs_expire_inflight()
    assert job_status(jid) == ("INFLIGHT", 0)
    assert pc.ack([{"ID": jid, "NextState": "DELIVERED"}]).json()["Result"][0]["Status"] == "DELIVERED"
