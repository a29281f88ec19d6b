"""Replay (issue 17 part 1) over HTTP against a real PostgreSQL: the window, onlyFailed, skips of
queued / in-flight jobs, new jobs for a consumer created later, 400s and auth, the advisory, the
admin form and ``manage.py replay``; then delivery of replayed jobs to a real receiver."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from broker.models import Message
from broker.times import rfc3339
from consumers.models import Consumer
from jobs.models import Job, JobStatus, JobTransition
from jobs.publish import replay as replay_module
from jobs.publish.replay import consumer_replay, jobs_replay_chunk
from jobs.pull.claim import jobs_claim
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.jobs.moves import Move, jobs_move
from tests.web.admin.conftest import consumer_pk

pytestmark = pytest.mark.django_db(transaction=True)

C2 = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"}


def db_clock():
    time.sleep(0.01)
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def publish(world, *ids):
    for mid in ids:
        assert world.publish(HTTP_X_BROKER_MESSAGE_ID=mid).status_code == 201


def job_of(consumer_id: str, message_id: str) -> Job | None:
    return Job.objects.filter(consumer__consumer_id=consumer_id, message__message_id=message_id).first()


def settle(consumer_id: str, outcome: dict) -> None:
    """Claim every QUEUED job of a pull consumer and end each as ``outcome[message_id]`` says
    (DELIVERED, DEAD, QUEUED = a failed attempt, INFLIGHT = left in flight), through the state machine."""
    claimed = jobs_claim(consumer_pk=consumer_pk(consumer_id), limit=100)
    moves = [Move(job_id=j.id, from_status=INFLIGHT, to_status=outcome[j.message_id],
                        retry_inc=1 if outcome[j.message_id] == QUEUED else 0,
                        delay=0 if outcome[j.message_id] == QUEUED else None)
             for j in claimed if outcome[j.message_id] != INFLIGHT]
    assert len(jobs_move(moves=moves, reason="test")) == len(moves)


def replay(body, client=None, consumer="c2", **headers):
    client = client or APIClient()
    return client.post(f"/channel/ch1/consumer/{consumer}/replay", body, format="json", **headers)


@pytest.fixture
def window(world):
    """ch1 with pull consumer c2: m1, m2 before the window, m3..m6 in it, m7 after; c2's jobs:
    m3 DELIVERED, m4 DEAD, m5 INFLIGHT, m6 QUEUED after a failed attempt, the others DELIVERED."""
    publish(world, "m1", "m2")
    since = db_clock()
    publish(world, "m3", "m4", "m5", "m6")
    until = db_clock()
    publish(world, "m7")
    settle("c2", {"m1": DELIVERED, "m2": DELIVERED, "m3": DELIVERED, "m4": DEAD,
                  "m5": INFLIGHT, "m6": QUEUED, "m7": DELIVERED})
    return since, until


def test_replay_window_requeues_delivered_and_dead_and_skips_queued_and_inflight(window):
    since, until = window
    r = replay({"since": rfc3339(since), "until": rfc3339(until)}, **C2)
    assert r.status_code == 202, r.content
    assert r.json() == {"Replayed": 2, "Skipped": 2}
    m3, m4, m5, m6 = (job_of("c2", m) for m in ("m3", "m4", "m5", "m6"))
    assert (m3.status, m3.retry_count) == (JobStatus.QUEUED, 0)
    assert (m4.status, m4.retry_count) == (JobStatus.QUEUED, 0)
    assert m5.status == JobStatus.INFLIGHT
    assert (m6.status, m6.retry_count) == (JobStatus.QUEUED, 1)  # untouched: still its failed attempt's
    for outside in ("m1", "m2", "m7"):
        assert job_of("c2", outside).status == JobStatus.DELIVERED
    history = {(t.job_id, t.from_status, t.to_status) for t in JobTransition.objects.filter(reason="replay")}
    assert history == {(m3.pk, JobStatus.DELIVERED, JobStatus.QUEUED), (m4.pk, JobStatus.DEAD, JobStatus.QUEUED)}
    # replayed jobs are pulled again like any other
    got = jobs_claim(consumer_pk=consumer_pk("c2"), limit=10)
    assert {j.message_id for j in got} == {"m3", "m4", "m6"}


def test_only_failed_replays_dead_jobs_only(window):
    since, _ = window
    r = replay({"since": rfc3339(since), "onlyFailed": True}, **C2)
    assert r.status_code == 202 and r.json() == {"Replayed": 1, "Skipped": 4}  # m3..m7: only m4 was DEAD
    assert job_of("c2", "m4").status == JobStatus.QUEUED
    assert job_of("c2", "m3").status == JobStatus.DELIVERED and job_of("c2", "m7").status == JobStatus.DELIVERED


def test_consumer_created_later_gets_fresh_jobs_and_a_second_replay_skips_them(window, make, api):
    since, until = window
    make.consumer("late", type="pull", token="late-token", callback=None)
    assert not Job.objects.filter(consumer__consumer_id="late").exists()
    r = replay({"since": rfc3339(since), "until": rfc3339(until)}, client=api, consumer="late")
    assert r.status_code == 202 and r.json() == {"Replayed": 4, "Skipped": 0}
    jobs = Job.objects.filter(consumer__consumer_id="late").select_related("message")
    assert sorted(j.message.message_id for j in jobs) == ["m3", "m4", "m5", "m6"]
    assert {(j.status, j.retry_count) for j in jobs} == {(JobStatus.QUEUED, 0)}
    assert JobTransition.objects.filter(job_id__in=[j.pk for j in jobs], reason="replay", from_status=None).count() == 4
    # onlyFailed never creates jobs; the new ones are QUEUED now, so a second replay skips them
    r = replay({"since": rfc3339(since), "onlyFailed": True}, client=api, consumer="late")
    assert r.json() == {"Replayed": 0, "Skipped": 5}  # m3..m7: m7 has no job, but onlyFailed creates none
    r = replay({"since": rfc3339(since)}, client=api, consumer="late")
    assert r.json() == {"Replayed": 1, "Skipped": 4}  # only m7 was missing


def test_replay_walks_chunks(window, monkeypatch):
    """Chunks of 2 messages: m1..m7 take four statements, each resuming after the last message seen."""
    calls = []
    real = jobs_replay_chunk

    def counting(**kwargs):
        calls.append((kwargs["limit"], kwargs["after_id"]))
        return real(**kwargs)

    monkeypatch.setattr(replay_module, "jobs_replay_chunk", counting)
    consumer = Consumer.objects.select_related("channel").get(consumer_id="c2")
    first = Message.objects.order_by("id").first()
    result = consumer_replay(consumer=consumer, since=first.received_at, chunk=2)
    ids = list(Message.objects.order_by("received_at", "id").values_list("id", flat=True))
    assert calls == [(2, 0), (2, ids[1]), (2, ids[3]), (2, ids[5])]  # 7 messages: 2 + 2 + 2 + 1
    assert (result.replayed, result.skipped) == (5, 2)  # all but m5 (in flight) and m6 (queued)
    assert job_of("c2", "m1").status == JobStatus.QUEUED and job_of("c2", "m7").status == JobStatus.QUEUED


@pytest.mark.parametrize(("body", "code"), [
    ({"since": "2030-01-01T00:00:00Z"}, "invalid_window"),  # entirely in the future
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "invalid_window"),  # until < since
    ({"since": "yesterday"}, "invalid_since"),
    ({"since": "2026-01-01T00:00:00"}, "invalid_since"),  # no time zone
    ({"since": "2026-01-01T00:00:00Z", "until": 5}, "invalid_until"),
    ({}, "invalid_since"),
    ({"since": "2026-01-01T00:00:00Z", "onlyFailed": "yes"}, "invalid_onlyFailed"),
    (["since"], "malformed_request"),
])
def test_bad_replay_requests_are_400_json(world, body, code):
    r = replay(body, **C2)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == code and r.json()["detail"]


def test_replay_auth(world):
    body = {"since": "2026-01-01T00:00:00Z"}
    assert replay(body).status_code == 401
    r = replay(body, HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_CONSUMER_TOKEN="wrong")
    assert r.status_code == 403 and "c2-token" not in r.content.decode()
    assert replay(body, HTTP_X_BROKER_ADMIN_TOKEN="wrong").status_code == 403
    assert replay(body, consumer="nope", **C2).status_code == 404
    assert replay(body, **C2).status_code == 202


def test_each_replay_is_an_advisory(window, api):
    since, until = window
    assert replay({"since": rfc3339(since), "until": rfc3339(until)}, client=api).status_code == 202
    advisories = api.get("/channel/ch1/consumer/c2/advisories").json()["Result"]
    [adv] = [a for a in advisories if a["type"] == "replay"]
    assert adv["replayed"] == 2 and adv["skipped"] == 2 and adv["only_failed"] is False
    assert adv["since"] == rfc3339(since) and adv["until"] == rfc3339(until) and adv["source"] == "admin-token"


def test_replay_command(window):
    since, until = window
    out = io.StringIO()
    call_command("replay", "ch1", "c2", "--since", rfc3339(since), "--until", rfc3339(until), stdout=out)
    assert out.getvalue().startswith("replayed 2 message(s) to ch1/c2, skipped 2")
    out = io.StringIO()
    call_command("replay", "ch1", "c2", "--since", rfc3339(since), "--only-failed", stdout=out)
    assert out.getvalue().startswith("replayed 0 message(s)")  # m4 is QUEUED now
    with pytest.raises(CommandError, match="until must not be before since"):
        call_command("replay", "ch1", "c2", "--since", rfc3339(until), "--until", rfc3339(since))
    with pytest.raises(CommandError, match="not found"):
        call_command("replay", "ch1", "nope", "--since", rfc3339(since))


def test_admin_replay_form(window, admin_client):
    pk = consumer_pk("c2")
    page = admin_client.get(f"/admin/consumers/consumer/{pk}/change/")
    assert f"/admin/consumers/consumer/{pk}/replay/" in page.content.decode()
    form = admin_client.get(f"/admin/consumers/consumer/{pk}/replay/")
    assert form.status_code == 200 and 'type="datetime-local"' in form.content.decode()
    before = Message.objects.order_by("id").first().received_at - timedelta(seconds=1)  # the form has seconds
    r = admin_client.post(f"/admin/consumers/consumer/{pk}/replay/",
                          {"since": before.strftime("%Y-%m-%dT%H:%M:%S"), "only_failed": "on"}, follow=True)
    assert [str(m) for m in r.context["messages"]] == ["Replayed 1 message to ch1/c2 (6 skipped)."]  # m1..m7
    assert job_of("c2", "m4").status == JobStatus.QUEUED and job_of("c2", "m3").status == JobStatus.DELIVERED
    bad = admin_client.post(f"/admin/consumers/consumer/{pk}/replay/",
                            {"since": "2099-01-01T00:00", "until": ""})
    assert bad.status_code == 200 and "the window lies in the future" in bad.content.decode()


def test_replayed_jobs_are_pushed_again(make, receiver, dispatcher, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"))
    since = db_clock()
    dispatcher()
    publish(make, "p1", "p2", "p3")
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 3, what="3 deliveries")
    assert len(receiver.at("/cb")) == 3
    r = replay({"since": rfc3339(since)}, client=api, consumer="c1")
    assert r.json() == {"Replayed": 3, "Skipped": 0}
    receiver.wait(lambda: len(receiver.at("/cb")) == 6, what="3 more callbacks")
    assert sorted(x.headers["x-broker-message-id"] for x in receiver.at("/cb")) == ["p1", "p1", "p2", "p2", "p3", "p3"]
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 3, what="delivered again")


def test_partitioned_jobs_and_messages_are_skipped(world, make, api):
    """A job put back below its partition's gate could never run: partitioned jobs stay as they are,
    and a consumer without a job for a partitioned message gets none."""
    since = db_clock()
    assert world.publish(HTTP_X_BROKER_MESSAGE_ID="k1", HTTP_X_BROKER_PARTITION_KEY="order-1").status_code == 201
    publish(world, "plain")
    settle("c2", {"k1": DELIVERED, "plain": DELIVERED})
    assert job_of("c2", "k1").partition_id is not None
    r = replay({"since": rfc3339(since)}, **C2)
    assert r.status_code == 202 and r.json() == {"Replayed": 1, "Skipped": 1}
    assert job_of("c2", "k1").status == JobStatus.DELIVERED and job_of("c2", "plain").status == JobStatus.QUEUED
    make.consumer("late", type="pull", token="late-token", callback=None)
    r = replay({"since": rfc3339(since)}, client=api, consumer="late")
    assert r.json() == {"Replayed": 1, "Skipped": 1} and job_of("late", "k1") is None
