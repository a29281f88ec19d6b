"""Jobs in the admin: filters, counts without COUNT(*), the job page, and the actions (requeue,
mark dead, delete dead) going through the job state machine."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker.xid import job_xid
from jobs.models import DeliveryAttempt, Job, JobStatus, JobTransition
from jobs.pull.claim import jobs_claim
from tests.jobs.moves import job_move
from tests.web.admin.conftest import consumer_pk, dead_ids, finish, queued_ids
from web.admin.jobs import JobAdmin

pytestmark = pytest.mark.django_db

URL = "/admin/jobs/job/"
DEAD, QUEUED, INFLIGHT, DELIVERED = (JobStatus.DEAD, JobStatus.QUEUED, JobStatus.INFLIGHT, JobStatus.DELIVERED)


def listed(response) -> list[int]:
    return [obj.pk for obj in response.context["cl"].result_list]


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def act(client, action: str, ids: list[int], follow: bool = True, **extra):
    return client.post(URL, {"action": action, "_selected_action": [str(i) for i in ids], **extra}, follow=follow)


# --- list, filters, counts ----------------------------------------------------------------------------

def test_list_filters(admin_client, broker, make):
    make.channel("ch2", token="t2")
    r = admin_client.get(URL, {"status__exact": DEAD})
    assert r.status_code == 200 and sorted(listed(r)) == dead_ids()
    c1, c2 = consumer_pk("c1"), consumer_pk("c2")
    assert len(listed(admin_client.get(URL, {"consumer": c2}))) == 10
    assert len(listed(admin_client.get(URL, {"consumer": c1, "status__exact": QUEUED}))) == 4
    channel = Job.objects.first().channel_id
    assert len(listed(admin_client.get(URL, {"channel": channel}))) == 20
    assert listed(admin_client.get(URL, {"channel": channel + 1000})) == []
    assert len(listed(admin_client.get(URL, {"attempts": "0"}))) == 20
    finish("c2", 2, QUEUED)  # two failed attempts
    assert len(listed(admin_client.get(URL, {"attempts": "1"}))) == 2
    assert len(listed(admin_client.get(URL, {"age": "lt5m"}))) == 20
    assert listed(admin_client.get(URL, {"age": "gt1h"})) == []
    with connection.cursor() as cur:  # test setup: an old job
        cur.execute("UPDATE jobs_job SET created_at = now() - interval '2 days' WHERE id = %s", [dead_ids()[0]])
    assert listed(admin_client.get(URL, {"age": "gt24h", "status__exact": DEAD})) == [dead_ids()[0]]


def test_priority_group_filter(admin_client, api, broker):
    """A pull consumer serving priority group A: the filter lists the group and shows only its jobs."""
    created = api.put("/channel/ch1/consumer/g1", {"token": "g", "type": "pull", "priorityPolicy": "overflow",
                                                  "priorityGroups": "A"})
    assert created.status_code == 200, created.content
    assert broker.publish(HTTP_X_BROKER_MESSAGE_ID="for-group").status_code == 201
    assert "?group=A" in admin_client.get(URL).content.decode()
    jobs = listed(admin_client.get(URL, {"group": "A"}))
    assert len(jobs) == 1
    assert set(Job.objects.filter(pk__in=jobs).values_list("consumer_id", flat=True)) == {consumer_pk("g1")}
    assert listed(admin_client.get(URL, {"group": "B"})) == []


def test_filter_values_that_are_not_numbers_show_nothing(admin_client, broker):
    for params in ({"consumer": "x"}, {"channel": "x"}, {"attempts": "x"}, {"age": "x"}):
        r = admin_client.get(URL, params)
        assert r.status_code == 200 and listed(r) == [], params


def test_search_by_job_id_or_message_id(admin_client, broker):
    job = dead_ids()[0]
    assert listed(admin_client.get(URL, {"q": job_xid(job)})) == [job]
    assert listed(admin_client.get(URL, {"q": str(job)})) == [], "the integer key is not a job ID"
    found = listed(admin_client.get(URL, {"q": "m03"}))
    assert len(found) == 2
    assert set(Job.objects.filter(pk__in=found).values_list("message__message_id", flat=True)) == {"m03"}
    assert listed(admin_client.get(URL, {"q": "nope"})) == []


def test_counts_come_from_counters_for_status_channel_consumer(admin_client, broker):
    with CaptureQueriesContext(connection) as ctx:
        r = admin_client.get(URL, {"status__exact": DEAD, "consumer": consumer_pk("c1")})
    assert r.context["cl"].result_count == 2
    assert not any("count(" in q["sql"].lower() and "jobs_job" in q["sql"] for q in ctx.captured_queries)
    assert admin_client.get(URL).context["cl"].result_count == 20
    assert '<span class="result-count">20</span> jobs' in admin_client.get(URL).content.decode()


def test_other_filters_count_at_most_the_cap(admin_client, broker, monkeypatch):
    monkeypatch.setattr(JobAdmin, "count_cap", 5)
    with CaptureQueriesContext(connection) as ctx:
        r = admin_client.get(URL, {"attempts": "0"})
    cl = r.context["cl"]
    assert cl.result_count == 5 and cl.paginator.capped
    counts = [q["sql"] for q in ctx.captured_queries if "count(" in q["sql"].lower() and "jobs_job" in q["sql"]]
    assert counts and all("LIMIT 6" in sql for sql in counts)
    html = r.content.decode()
    assert '<span class="result-count">5+</span>' in html and "not counted further" in html


def test_list_never_loads_payloads(admin_client, broker):
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(URL)
    selects = [q["sql"] for q in ctx.captured_queries if 'FROM "jobs_job"' in q["sql"] and "broker_message" in q["sql"]]
    assert selects and not any('"broker_message"."payload"' in sql for sql in selects)


# --- the job's page -----------------------------------------------------------------------------------

def test_job_page_shows_payload_headers_attempts_and_history(admin_client, world):
    body = b'{"order": 7, "items": [1, 2]}'
    r = world.publish(body=body, HTTP_X_BROKER_MESSAGE_ID="order-7", HTTP_X_BROKER_METADATA_HEADERS="X-Trace",
                      HTTP_X_TRACE="trace-abc")
    assert r.status_code == 201
    job = Job.objects.get(consumer__consumer_id="c1", message__message_id="order-7")
    claimed = jobs_claim(consumer_pk=job.consumer_id, limit=1)
    assert claimed[0].id == job.pk
    DeliveryAttempt.objects.create(job_id=job.pk, attempt=1, started_at=job.created_at, duration_ms=12.5,
                                   status_code=503, response_excerpt="upstream down", outcome="failed")
    job_move(job_id=job.pk, from_status=INFLIGHT, to_status=DEAD, reason="push")
    html = admin_client.get(f"{URL}{job_xid(job.pk)}/change/").content.decode()
    assert "order-7" in html
    assert json.dumps({"order": 7, "items": [1, 2]}, indent=2).replace('"', "&quot;") in html  # pretty JSON
    assert f"JSON, {len(body)} bytes" in html
    assert "X-Trace" in html and "trace-abc" in html  # headers
    assert "upstream down" in html and "503" in html and "12.5 ms" in html
    assert html.count("INFLIGHT") >= 2 and "QUEUED" in html  # QUEUED -> INFLIGHT -> DEAD
    assert 'id="job-requeue"' in html and 'id="job-delete-dead"' in html and 'id="job-mark-dead"' not in html
    assert 'name="_save"' not in html  # nothing to save: every field is read-only


def test_big_payload_is_cut_and_binary_is_shown_as_hex(admin_client, world, settings):
    settings.BROKER_ADMIN_PAYLOAD_PREVIEW_BYTES = 1000
    big = json.dumps({"data": "x" * 5000}).encode()
    assert world.publish(body=big, HTTP_X_BROKER_MESSAGE_ID="big").status_code == 201
    assert world.publish(body=bytes(range(256)), content_type="application/octet-stream",
                         HTTP_X_BROKER_MESSAGE_ID="bin").status_code == 201
    job = Job.objects.get(consumer__consumer_id="c1", message__message_id="big")
    html = admin_client.get(f"{URL}{job_xid(job.pk)}/change/").content.decode()
    assert f"{len(big):,} bytes; showing the first 1,000" in html
    assert "x" * 1500 not in html
    job = Job.objects.get(consumer__consumer_id="c1", message__message_id="bin")
    html = admin_client.get(f"{URL}{job_xid(job.pk)}/change/").content.decode()
    assert "binary, 256 bytes" in html and "00 01 02 03" in html


def test_a_job_with_its_own_payload_shows_that_payload_with_its_message_content_type(admin_client, world):
    assert world.publish(body=b'{"from": "producer"}', HTTP_X_BROKER_MESSAGE_ID="own").status_code == 201
    job = Job.objects.get(consumer__consumer_id="c1", message__message_id="own")
    html = admin_client.get(f"{URL}{job_xid(job.pk)}/change/").content.decode()
    assert "&quot;producer&quot;" in html and "own payload" not in html
    Job.objects.filter(pk=job.pk).update(payload=b'{"from": "handler"}')  # as a handler-driven gate move sets it
    html = admin_client.get(f"{URL}{job_xid(job.pk)}/change/").content.decode()
    assert "this job&#x27;s own payload" in html and "&quot;handler&quot;" in html
    assert "JSON, 19 bytes" in html  # pretty-printed: the message's content type (JSON) goes with it


def test_posting_the_job_form_changes_nothing(admin_client, broker):
    job = dead_ids()[0]
    r = admin_client.post(f"{URL}{job_xid(job)}/change/", {"status": QUEUED, "retry_count": 0})
    assert r.status_code in (200, 302)
    assert Job.objects.get(pk=job).status == DEAD


# --- actions ------------------------------------------------------------------------------------------

def test_requeue_action_moves_only_dead_jobs(admin_client, broker):
    dead = dead_ids()
    queued = queued_ids("c1", 1)
    r = act(admin_client, "requeue", dead + queued)
    assert "Requeued 2 dead jobs. 1 selected job left alone: not dead (only dead jobs are requeued)." in messages_of(r)
    assert set(Job.objects.filter(pk__in=dead).values_list("status", "retry_count")) == {(QUEUED, 0)}
    assert JobTransition.objects.filter(job_id__in=dead, from_status=DEAD, to_status=QUEUED,
                                        reason="admin-requeue").count() == 2


def test_mark_dead_action_kills_queued_and_inflight_jobs(admin_client, broker):
    queued = queued_ids("c1", 2)
    inflight = list(Job.objects.filter(status=INFLIGHT).values_list("id", flat=True))
    delivered = list(Job.objects.filter(status=DELIVERED).values_list("id", flat=True)[:1])
    r = act(admin_client, "mark_dead", queued + inflight + delivered)
    assert ("Marked 3 jobs dead (2 were queued, 1 in flight). 1 selected job left alone: already delivered "
            "or dead.") in messages_of(r)
    assert set(Job.objects.filter(pk__in=queued + inflight).values_list("status", flat=True)) == {DEAD}
    assert Job.objects.get(pk=delivered[0]).status == DELIVERED
    history = set(JobTransition.objects.filter(reason="admin-mark-dead").values_list("from_status", "to_status"))
    assert history == {(QUEUED, DEAD), (INFLIGHT, DEAD)}


def test_delete_dead_action_deletes_only_dead_jobs(admin_client, broker):
    dead = dead_ids()
    queued = queued_ids("c1", 1)
    r = act(admin_client, "delete_dead", dead + queued)
    assert "Deleted 2 dead jobs. 1 selected job left alone: not dead (only dead jobs are deleted)." in messages_of(r)
    assert not Job.objects.filter(pk__in=dead).exists() and Job.objects.filter(pk__in=queued).exists()


def test_select_across_requeues_every_matching_job(admin_client, broker):
    finish("c2", 3, DEAD)
    r = act(admin_client, "requeue", dead_ids()[:1], select_across="1")  # no filter: every job
    assert "Requeued 5 dead jobs." in messages_of(r)
    assert not Job.objects.filter(status=DEAD).exists()


def test_counters_follow_the_actions(admin_client, broker):
    from broker.counters import JOB, counts_for

    act(admin_client, "requeue", dead_ids())
    counts = counts_for(scope=JOB, owner_ids=[consumer_pk("c1")])[consumer_pk("c1")]
    assert counts.get(DEAD, 0) == 0 and counts[QUEUED] == 6


def test_default_delete_is_not_offered(admin_client, broker):
    html = admin_client.get(URL).content.decode()
    assert 'value="delete_selected"' not in html
    assert 'value="requeue"' in html and 'value="mark_dead"' in html and 'value="delete_dead"' in html


# --- one-job buttons ----------------------------------------------------------------------------------

def test_job_buttons(admin_client, broker):
    job = dead_ids()[0]
    assert admin_client.get(f"{URL}{job_xid(job)}/requeue/").status_code == 405
    r = admin_client.post(f"{URL}{job_xid(job)}/requeue/", follow=True)
    assert "Requeued 1 dead job." in messages_of(r)
    assert Job.objects.get(pk=job).status == QUEUED
    r = admin_client.post(f"{URL}{job_xid(job)}/mark-dead/", follow=True)
    assert "Marked 1 job dead (1 were queued, 0 in flight)." in messages_of(r)
    assert Job.objects.get(pk=job).status == DEAD
    r = admin_client.post(f"{URL}{job_xid(job)}/delete-dead/")
    assert r.status_code == 302 and r["Location"] == URL
    assert not Job.objects.filter(pk=job).exists()
    assert admin_client.post(f"{URL}{job_xid(job)}/requeue/").status_code == 404


def test_a_view_only_user_cannot_act(client, broker):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    job = dead_ids()[0]
    html = client.get(f"{URL}{job_xid(job)}/change/").content.decode()
    assert "job-requeue" not in html
    assert 'value="requeue"' not in client.get(URL).content.decode()
    assert client.post(f"{URL}{job_xid(job)}/requeue/").status_code == 403
    assert client.post(f"{URL}{job_xid(job)}/delete-dead/").status_code == 403
    act(client, "requeue", [job])
    assert Job.objects.get(pk=job).status == DEAD


# --- history tables -----------------------------------------------------------------------------------

def test_attempt_and_transition_lists(admin_client, broker):
    job = dead_ids()[0]
    DeliveryAttempt.objects.create(job_id=job, attempt=1, started_at=Job.objects.get(pk=job).created_at,
                                   status_code=500, error="", response_excerpt="boom", outcome="failed")
    r = admin_client.get("/admin/jobs/deliveryattempt/", {"code": "5", "outcome": "failed", "recent": "1h"})
    assert r.status_code == 200 and len(r.context["cl"].result_list) == 1
    assert f"/admin/jobs/job/{job_xid(job)}/change/" in r.content.decode()
    assert len(admin_client.get("/admin/jobs/deliveryattempt/", {"code": "2"}).context["cl"].result_list) == 0
    r = admin_client.get("/admin/jobs/jobtransition/", {"to": str(DEAD), "q": job_xid(job)})
    assert [t.job_id for t in r.context["cl"].result_list] == [job]
    assert admin_client.get("/admin/jobs/jobtransition/add/").status_code == 403
