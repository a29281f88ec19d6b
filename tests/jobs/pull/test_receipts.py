"""Receipts (issue 23, jobs.pull.ack): every claim of a job gets a receipt that never repeats for
it; an ack item or a progress carrying a receipt that is not the job's current claim changes nothing
and says so (``stale_receipt``); without a receipt everything is as before."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.postgres.functions import TransactionNow

from broker.xid import job_pk
from jobs.models import Job
from jobs.push.claim import jobs_claim_push
from jobs.sweeps.inflight_timeout import jobs_expire_inflight
from tests.jobs.pull.conftest import PULL_HEADERS, PullClient, claim_one, job_status, publish_n

pytestmark = pytest.mark.django_db


def _lease_runs_out(job_id: str) -> None:
    """The holder's lease runs out: the deadline passes and the sweep queues the job again.

    The deadline is set from the transaction's clock: the test runs in one transaction, whose
    ``now()`` (what the sweep compares with) is its start, so a deadline of Python's now - 1 s
    is not yet past once the test's first requests took over a second (a loaded machine)."""
    Job.objects.filter(pk=job_pk(job_id)).update(deadline=TransactionNow() - timedelta(seconds=1))
    assert jobs_expire_inflight() == 1
    assert job_status(job_id) == ("QUEUED", 1)


def _pulled(pc, n: int = 1) -> list[dict]:
    r = pc.pull(batch=n)
    assert r.status_code == 200, r.content
    return r.json()["Result"]


def test_a_late_ack_of_an_earlier_claim_changes_nothing(world, pc):
    publish_n(world, 2)
    first, other = _pulled(pc, 2)
    assert isinstance(first["Receipt"], str) and first["Receipt"] != other["Receipt"]
    _lease_runs_out(first["ID"])
    [again] = _pulled(pc)  # someone else (here: the same consumer again) holds it now
    assert again["ID"] == first["ID"] and again["Attempt"] == 2 and again["Receipt"] != first["Receipt"]
    # the first holder's late outcomes: a nack would put the new holder's job back in the queue
    for state in ("QUEUED", "DELIVERED", "DEAD"):
        r = pc.ack([{"ID": first["ID"], "NextState": state, "Receipt": first["Receipt"]},
                    {"ID": other["ID"], "NextState": "DELIVERED", "Receipt": other["Receipt"]}]
                   if state == "QUEUED" else [{"ID": first["ID"], "NextState": state, "Receipt": first["Receipt"]}])
        assert r.status_code == 200, r.content
        stale = r.json()["Result"][0]
        assert stale["ID"] == first["ID"] and stale["Status"] == "INFLIGHT" and stale["Error"] == "stale_receipt"
        assert stale["Detail"]
        assert job_status(first["ID"]) == ("INFLIGHT", 1)
    assert job_status(other["ID"]) == ("DELIVERED", 0)  # the current receipt of another job in the batch: moved
    # a receipt the broker never issued is stale too (never a 500)
    for forged in ("0", "x", "99999999999999999999", ""):
        r = pc.ack([{"ID": first["ID"], "NextState": "DELIVERED", "Receipt": forged}])
        assert r.json()["Result"][0]["Error"] == "stale_receipt"
    # the current holder's ack lands
    r = pc.ack([{"ID": again["ID"], "NextState": "DELIVERED", "Receipt": again["Receipt"]}])
    assert r.json()["Result"][0] == {"ID": again["ID"], "Status": "DELIVERED", "RetryCount": 1}
    # repeated (a retried request whose answer was lost): its receipt still this claim's and the job
    # already DELIVERED, as asked: answered as done, without an Error (SQS / Pub/Sub acks are idempotent)
    r = pc.ack([{"ID": again["ID"], "NextState": "DELIVERED", "Receipt": again["Receipt"]}])
    assert r.json()["Result"][0] == {"ID": again["ID"], "Status": "DELIVERED", "RetryCount": 1}
    assert job_status(again["ID"]) == ("DELIVERED", 1)
    # ... but asking for another state than the one it is in is still a conflict, as is a repeat without receipt
    r = pc.ack([{"ID": again["ID"], "NextState": "DEAD", "Receipt": again["Receipt"]}])
    assert r.json()["Result"][0]["Error"] == "conflict" and r.json()["Result"][0]["Status"] == "DELIVERED"
    r = pc.ack([{"ID": again["ID"], "NextState": "DELIVERED"}])
    assert r.json()["Result"][0]["Error"] == "conflict"
    assert job_status(again["ID"]) == ("DELIVERED", 1)


def test_without_a_receipt_an_ack_behaves_as_before(world, pc):
    publish_n(world, 1)
    [first] = _pulled(pc)
    _lease_runs_out(first["ID"])
    [again] = _pulled(pc)
    r = pc.ack([{"ID": first["ID"], "NextState": "QUEUED"}])  # no Receipt: whichever claim is current
    assert r.json()["Result"][0] == {"ID": again["ID"], "Status": "QUEUED", "RetryCount": 2}


def test_progress_with_a_stale_receipt_is_409(world, pc):
    publish_n(world, 1)
    [first] = _pulled(pc)
    assert pc.progress(first["ID"], Receipt=first["Receipt"]).status_code == 200
    _lease_runs_out(first["ID"])
    [again] = _pulled(pc)
    deadline = Job.objects.get(pk=job_pk(again["ID"])).deadline
    r = pc.progress(first["ID"], Receipt=first["Receipt"], IncrementalTimeout=600)
    assert r.status_code == 409 and r.json()["error"] == "stale_receipt", r.content
    assert Job.objects.get(pk=job_pk(again["ID"])).deadline == deadline  # nothing changed
    r = pc.progress(first["ID"], Receipt=again["Receipt"])
    assert r.status_code == 200 and r.json()["Status"] == "INFLIGHT"
    assert pc.progress(first["ID"]).status_code == 200  # without a receipt: as before
    assert pc.progress(first["ID"], Receipt=7).status_code == 400  # not the string the broker sent
    # settled: not in flight, whatever the receipt
    assert pc.ack([{"ID": again["ID"], "NextState": "DELIVERED"}]).json()["Result"][0]["Status"] == "DELIVERED"
    r = pc.progress(first["ID"], Receipt=again["Receipt"])
    assert r.status_code == 409 and r.json()["error"] == "job_not_inflight"


def test_every_claim_path_gives_a_new_receipt_even_across_a_replay(world, pc, api):
    publish_n(world, 1)
    jid = claim_one(pc)  # the spec's QUEUED -> INFLIGHT: the receipt comes in a header
    r = pc.set_state(jid, {"NextState": "DEAD"})
    assert r.status_code == 202 and "X-Broker-Receipt" not in r
    assert pc.requeue(jid).status_code in (200, 202)  # DEAD -> QUEUED, retry count reset
    receipts = set()
    for _ in range(3):
        r = pc.set_state(jid, {"NextState": "INFLIGHT"})
        assert r.status_code == 202 and r["X-Broker-Receipt"]
        receipts.add(r["X-Broker-Receipt"])
        assert pc.set_state(jid, {"NextState": "DEAD"}).status_code == 202
    assert len(receipts) == 3  # DEAD -> INFLIGHT claims it again: a new receipt each time
    pc.requeue(jid)
    [pulled] = _pulled(pc)
    assert pulled["Receipt"] not in receipts
    r = pc.ack([{"ID": jid, "NextState": "DELIVERED", "Receipt": sorted(receipts)[0]}])
    assert r.json()["Result"][0]["Error"] == "stale_receipt"
    r = pc.ack([{"ID": jid, "NextState": "DELIVERED", "Receipt": pulled["Receipt"]}])
    assert r.json()["Result"][0]["Status"] == "DELIVERED"


def test_grouped_pulls_and_push_claims_carry_receipts_too(world, api, client_anon):
    r = api.put("/channel/ch1/consumer/grp", {"token": "g-token", "type": "pull", "priorityPolicy": "overflow",
                                              "priorityGroups": ["A"]}, format="json")
    assert r.status_code == 200, r.content
    publish_n(world, 2)  # to every consumer of ch1: the push consumer c1, pull c2, grouped grp
    grouped = PullClient(client_anon, base="/channel/ch1/consumer/grp",
                         headers={**PULL_HEADERS, "HTTP_X_BROKER_CONSUMER_TOKEN": "g-token"})
    [job] = grouped.pull(group="A", batch=1).json()["Result"]
    assert job["Receipt"].isdigit()
    r = grouped.ack([{"ID": job["ID"], "NextState": "DELIVERED", "Receipt": str(int(job["Receipt"]) + 10**6)}])
    assert r.json()["Result"][0]["Error"] == "stale_receipt"
    r = grouped.ack([{"ID": job["ID"], "NextState": "DELIVERED", "Receipt": job["Receipt"]}])
    assert r.json()["Result"][0]["Status"] == "DELIVERED"
    pushed = jobs_claim_push(limit=10)
    assert len(pushed) == 2
    receipts = list(Job.objects.filter(pk__in=[p.id for p in pushed]).values_list("receipt", flat=True))
    assert None not in receipts and len(set(receipts)) == 2 and int(job["Receipt"]) not in receipts


def test_a_repeated_nack_with_its_receipt_is_answered_as_done_and_changes_nothing(world, pc):
    """A negative ack sent again (its answer lost between the commit and the client): the job is
    QUEUED with that claim's receipt, as asked, so the repeat answers as the first did and does not
    spend another retry."""
    publish_n(world, 1)
    [job] = _pulled(pc)
    item = {"ID": job["ID"], "NextState": "QUEUED", "Receipt": job["Receipt"], "Delay": 60}
    first = pc.ack([item]).json()["Result"][0]
    assert first == {"ID": job["ID"], "Status": "QUEUED", "RetryCount": 1}
    assert pc.ack([item]).json()["Result"][0] == first
    assert job_status(job["ID"]) == ("QUEUED", 1)
