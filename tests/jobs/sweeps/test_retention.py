"""Retention (issue 24) over HTTP with a real PostgreSQL: a finished message past its channel's
(tiny) retention goes with its jobs, history and attempts within one housekeeping step; a QUEUED or
INFLIGHT job keeps its message, also against a replay racing the sweep; DEAD jobs count as finished
once older than BROKER_DEAD_RETENTION; the global default applies when the channel field is empty;
the PUT field's 400s; the counters, the footprint figures on the GETs, /metrics and the dashboard."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from broker.models import Message
from consumers.models import Consumer
from jobs.housekeeping import housekeeping_run
from jobs.models import DeliveryAttempt, Job, JobStatus, JobTransition, RetentionCursor
from jobs.publish.replay import consumer_replay
from jobs.push.claim import jobs_claim_push
from jobs.push.record import PushOutcome, jobs_push_record
from jobs.sweeps.retention import retention_run
from tests.jobs.pull.conftest import PullClient

pytestmark = pytest.mark.django_db(transaction=True)
WINDOW = 1.15  # seconds slept past a 1 s retention


def _pull_world(make, channel="ch1"):
    """A channel with only the pull consumer c2 (so nothing else holds its messages back)."""
    make.channel(channel)
    make.producer()
    make.consumer("c2", channel=channel, type="pull", token="c2-token", callback=None)
    return PullClient(APIClient(), base=f"/channel/{channel}/consumer/c2")


def _retention_put(api, channel, value):
    since = api.get(f"/channel/{channel}")["Last-Modified"]
    return api.put(f"/channel/{channel}", {"retention": value}, HTTP_IF_UNMODIFIED_SINCE=since)


def _publish(make, *ids, channel="ch1"):
    for mid in ids:
        assert make.publish(channel=channel, HTTP_X_BROKER_MESSAGE_ID=mid).status_code == 201


def _ack(pc, n, state="DELIVERED"):
    jobs = pc.pull(batch=n).json()["Result"]
    assert len(jobs) == n
    assert pc.ack([{"ID": j["ID"], "NextState": state} for j in jobs]).status_code == 200
    return [j["Message"]["MessageID"] for j in jobs]


def _stored(*ids):
    return set(Message.objects.filter(message_id__in=ids).values_list("message_id", flat=True))


def _metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$" if labels else rf"^{name} (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


def test_finished_message_goes_with_jobs_history_attempts_and_every_figure_follows(
        world, api, admin_client):
    """Push (attempt rows) and pull consumers, channel retention 1s: three finished messages go in
    one housekeeping step, the queued one stays; counts, footprint, /metrics and dashboard agree."""
    assert _retention_put(api, "ch1", "1s").json()["Retention"] == "1s"
    _publish(world, "a", "b", "c")
    claimed = jobs_claim_push(limit=10)
    assert len(claimed) == 3
    jobs_push_record(outcomes=[PushOutcome(
        job_id=j.id, to_status=JobStatus.DELIVERED, attempt=1, age=0, duration_ms=1, status_code=204,
        excerpt="", error="", request_id="t", outcome="delivered") for j in claimed])
    pc = PullClient(APIClient())
    _ack(pc, 3)
    _publish(world, "queued")  # both its jobs stay QUEUED
    finished = ["a", "b", "c"]
    gone_jobs = list(Job.objects.filter(message__message_id__in=finished).values_list("id", flat=True))
    transitions = JobTransition.objects.filter(job_id__in=gone_jobs).count()
    attempts = DeliveryAttempt.objects.filter(job_id__in=gone_jobs).count()
    assert len(gone_jobs) == 6 and transitions == 12 and attempts >= 3
    c2_jobs = list(Job.objects.filter(consumer__consumer_id="c2", message__message_id__in=finished)
                   .values_list("id", flat=True))
    c2_transitions = JobTransition.objects.filter(job_id__in=c2_jobs).count()
    c2_attempts = DeliveryAttempt.objects.filter(job_id__in=c2_jobs).count()
    assert api.get("/channel/ch1/consumer/c2").json()["NumDelivered"] == 3
    time.sleep(WINDOW)

    result = housekeeping_run()
    assert result["retention_removed"] == 3 + 6 + transitions + attempts
    assert _stored("a", "b", "c", "queued") == {"queued"}
    assert not Job.objects.filter(id__in=gone_jobs).exists()
    assert not JobTransition.objects.filter(job_id__in=gone_jobs).exists()
    assert not DeliveryAttempt.objects.filter(job_id__in=gone_jobs).exists()
    assert not JobTransition.objects.filter(to_status=0).exists()  # no GONE rows for what retention removed
    assert Job.objects.filter(message__message_id="queued", status=JobStatus.QUEUED).count() == 2

    # the consumer GET: maintained counts follow the deletes; its footprint
    body = api.get("/channel/ch1/consumer/c2").json()
    assert (body["NumDelivered"], body["NumPending"], body["NumDead"]) == (0, 1, 0)
    queued_at = Message.objects.get(message_id="queued").received_at
    f = body["Footprint"]
    assert f["Retention"] == "1s" and f["RemovedByRetention"] == {
        "Jobs": 3, "Transitions": c2_transitions, "Attempts": c2_attempts}
    assert f["OldestMessageAt"] and f["OldestMessageAt"].startswith(queued_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert 0 <= f["OldestMessageAgeSeconds"] < 60 and f["RetentionLastRunAt"].endswith("Z")
    assert f["RetentionLastRunSeconds"] >= 0
    # the channel GET
    body = api.get("/channel/ch1").json()
    assert body["Retention"] == "1s"
    f = body["Footprint"]
    assert f["RemovedByRetention"] == {"Messages": 3, "Jobs": 6, "Transitions": transitions, "Attempts": attempts}
    assert f["Retention"] == "1s" and f["OldestMessageAt"] is not None and f["RetentionLastRunAt"]
    # /metrics
    text = APIClient().get("/metrics").content.decode()
    assert _metric(text, "broker_messages", channel="ch1") == 1
    assert _metric(text, "broker_jobs", channel="ch1", consumer="c2", status="DELIVERED") == 0
    assert _metric(text, "broker_jobs", channel="ch1", consumer="c1", status="QUEUED") == 1
    assert _metric(text, "broker_retention_removed_total", channel="ch1", table="messages") == 3
    assert _metric(text, "broker_retention_removed_total", channel="ch1", table="transitions") == transitions
    assert _metric(text, "broker_retention_seconds", channel="ch1") == 1
    assert 0 <= _metric(text, "broker_oldest_message_age_seconds", channel="ch1") < 60
    assert _metric(text, "broker_retention_runs_total") >= 1
    assert _metric(text, "broker_retention_run_duration_seconds_count") == _metric(text, "broker_retention_runs_total")
    assert _metric(text, "broker_retention_last_run_timestamp_seconds") > time.time() - 60
    # the dashboard
    html = admin_client.get("/admin/").content.decode()
    line = re.search(r'<p class="dash-meta" id="retention">(.*?)</p>', html, re.S).group(1)
    assert "last run" in line and "3 messages, 6 jobs" in line and f"{transitions} state changes" in line
    row = re.search(r'data-channel="ch1">(.*?)</tr>', html, re.S).group(1)
    assert re.search(rf"kept 1s, oldest \d+ s, {3 + 6 + transitions + attempts} rows removed", row)


def test_queued_and_inflight_jobs_keep_their_message_until_finished(make, api):
    pc = _pull_world(make)
    assert _retention_put(api, "ch1", "1s").status_code == 200
    _publish(make, "done")
    _ack(pc, 1)
    _publish(make, "inflight", "queued")
    [held] = pc.pull(batch=1).json()["Result"]
    assert held["Message"]["MessageID"] == "inflight"
    time.sleep(WINDOW)
    for _ in range(3):  # the tip, then passes over what it held back
        retention_run(sweep_every=0)
    assert _stored("done", "inflight", "queued") == {"inflight", "queued"}
    assert Job.objects.filter(status=JobStatus.INFLIGHT).count() == 1
    # finished later: the pass over held-back messages removes it; the queued one stays
    assert pc.ack([{"ID": held["ID"], "NextState": "DELIVERED"}]).status_code == 200
    assert retention_run(sweep_every=0).removed.messages == 1
    assert _stored("inflight", "queued") == {"queued"}
    cursor = RetentionCursor.objects.get(channel__channel_id="ch1")
    assert cursor.tip_at is not None and cursor.sweep_started_at is not None
    # and the message id may be published again (the dedupe window is the retention)
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="done").status_code == 201


def test_dead_jobs_count_as_finished_once_older_than_dead_retention(make, api, settings):
    pc = _pull_world(make)
    assert _retention_put(api, "ch1", "1s").status_code == 200
    _publish(make, "dead", "delivered")
    jobs = pc.pull(batch=2).json()["Result"]
    states = {"dead": "DEAD", "delivered": "DELIVERED"}
    assert pc.ack([{"ID": j["ID"], "NextState": states[j["Message"]["MessageID"]]} for j in jobs]).status_code == 200
    time.sleep(WINDOW)
    assert retention_run().removed.messages == 1  # BROKER_DEAD_RETENTION (30 days) keeps the dead one
    assert _stored("dead", "delivered") == {"dead"}
    assert api.get("/channel/ch1/consumer/c2/dlq").json()["DeadJobs"]
    settings.BROKER_DEAD_RETENTION = timedelta(seconds=1)
    assert retention_run(sweep_every=0).removed.messages == 1
    assert _stored("dead") == set() and not Job.objects.exists()
    assert api.get("/channel/ch1/consumer/c2").json()["NumDead"] == 0


def test_the_global_default_applies_when_the_channel_field_is_empty(make, api, settings):
    settings.BROKER_RETENTION = timedelta(seconds=1)
    pc1 = _pull_world(make, "ch1")
    make.channel("ch2")
    make.consumer("c2", channel="ch2", type="pull", token="c2-token", callback=None)
    pc2 = PullClient(APIClient(), base="/channel/ch2/consumer/c2",
                     headers={"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"})
    assert _retention_put(api, "ch2", "1h").json()["Retention"] == "1h"
    _publish(make, "one", channel="ch1")
    _publish(make, "two", channel="ch2")
    _ack(pc1, 1)
    _ack(pc2, 1)
    time.sleep(WINDOW)
    assert retention_run().removed.messages == 1
    assert _stored("one", "two") == {"two"}
    one, two = api.get("/channel/ch1").json(), api.get("/channel/ch2").json()
    assert one["Retention"] is None and one["Footprint"]["Retention"] == "1s"
    assert two["Retention"] == "1h" and two["Footprint"]["Retention"] == "1h"
    # emptying the field hands the channel back to the default
    assert _retention_put(api, "ch2", "").json()["Retention"] is None
    assert retention_run().removed.messages == 1 and _stored("two") == set()


def test_a_replay_racing_the_sweep_never_loses_a_queued_job(make, api):
    """A replay moves DELIVERED jobs back to QUEUED (small chunks) while sweeps run in a loop: every
    message ends either removed or replayed with its QUEUED job, none with its job gone."""
    pc = _pull_world(make)
    assert _retention_put(api, "ch1", "1s").status_code == 200
    n = 120
    for i in range(0, n, 40):
        r = APIClient().generic("POST", "/channel/ch1/messages",
                                json.dumps([{"MessageID": f"r{i + k}", "Payload": "x"} for k in range(40)]),
                                content_type="application/json", HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                                HTTP_X_BROKER_PRODUCER_ID="p1", HTTP_X_BROKER_PRODUCER_TOKEN="p-token")
        assert r.status_code == 201, r.content
    for _ in range(n // 40):
        _ack(pc, 40)
    time.sleep(WINDOW)
    consumer = Consumer.objects.select_related("channel").get(consumer_id="c2")
    since = Message.objects.order_by("received_at").first().received_at - timedelta(seconds=1)
    done, outcome = threading.Event(), {}

    def replayer():
        try:
            outcome["result"] = consumer_replay(consumer=consumer, since=since, chunk=4)
        finally:
            done.set()
            connection.close()

    thread = threading.Thread(target=replayer, daemon=True)
    thread.start()
    removed = 0
    while not done.is_set():
        removed += retention_run(limit=3, budget=0.05, sweep_every=0).removed.messages
    thread.join(10)
    replayed = outcome["result"].replayed
    print("race: removed", removed, "replayed", replayed)
    assert removed > 0 and replayed > 0, (removed, replayed)  # the two did meet
    # every job the replay queued is still there, with its message and history
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == replayed
    assert Message.objects.count() == n - removed
    queued = Job.objects.filter(status=JobStatus.QUEUED).values("id")
    assert JobTransition.objects.filter(job_id__in=queued, reason="replay").count() == replayed
    assert not JobTransition.objects.exclude(job_id__in=Job.objects.values("id")).exists()  # no orphans
    assert replayed + removed == n
    assert api.get("/channel/ch1/consumer/c2").json()["NumPending"] == replayed


@pytest.mark.parametrize("bad", ["soon", "-1s", "0", "0s", "1.5h", "7x", "3651d", "99999999999999", "d7", "1 2"])
def test_retention_put_refuses_bad_durations(make, api, bad):
    make.channel()
    r = _retention_put(api, "ch1", bad)
    assert r.status_code == 400 and r.json()["error"] == "invalid_retention" and r.json()["detail"], bad
    assert api.get("/channel/ch1").json()["Retention"] is None


def test_retention_put_takes_durations_and_shows_them(make, api):
    make.channel()
    for given, shown in (("90s", "90s"), ("15m", "15m"), ("7d", "7d"), ("3600", "1h"), ("2w", "14d"),
                         (" 12H ", "12h"), (120, "2m"), ("none", None), ("7d", "7d"), ("", None)):
        r = api.put("/channel/ch1", {"retention": given},
                    HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"], format="json")
        assert r.status_code == 200, (given, r.content)
        assert r.json()["Retention"] == shown and api.get("/channel/ch1").json()["Retention"] == shown, given
    # created with it, and left alone by a PUT that does not name it
    r = api.put("/channel/ch9", {"token": "t", "retention": "15m"})
    assert r.status_code == 200 and r.json()["Retention"] == "15m"
    r = api.put("/channel/ch9", {"name": "Nine"}, HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r.status_code == 200 and r.json()["Retention"] == "15m"
