"""The dashboard (admin index): counts, per-minute figures, charts, alerts; bounded queries."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.template.defaultfilters import floatformat
from django.test.utils import CaptureQueriesContext

from jobs.advisories.record import advisory_record
from jobs.ops.dashboard import ALERT_RULES, MINUTES, RATE_MINUTES, Alert, Series, alert_rule, dashboard_snapshot
from jobs.ops.dead_jobs import jobs_requeue_dead
from jobs.pull.claim import jobs_claim
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.jobs.moves import job_move
from tests.web.admin.conftest import consumer_pk, finish

pytestmark = pytest.mark.django_db


def consumer_stats(dash, consumer_id):
    return next(c for c in dash.consumers if c.consumer.consumer_id == consumer_id)


def test_dashboard_needs_a_staff_login(client, broker):
    r = client.get("/admin/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")


def test_dashboard_shows_counts_charts_and_alerts(admin_client, broker):
    r = admin_client.get("/admin/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'id="broker-dashboard"' in html
    # per consumer rows with the maintained counts: c1 = 4 queued, 1 in flight, 3 delivered, 2 dead
    row = re.search(r'data-consumer="ch1/c1">(.*?)</tr>', html, re.S).group(1)
    numbers = re.findall(r'<td class="num[^"]*"><a href="[^"]*">([\d,]+)</a></td>', row)
    assert numbers[:4] == ["4", "1", "3", "2"]
    assert "status__exact=1004" in row and f"consumer={consumer_pk('c1')}" in row
    row2 = re.search(r'data-consumer="ch1/c2">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r'<td class="num[^"]*"><a href="[^"]*">([\d,]+)</a></td>', row2)[:4] == ["10", "0", "0", "0"]
    # alert for the dead jobs, linking to them
    assert 'class="alert-error alert-kind-dead"' in html and "2 dead jobs" in html
    # charts are inline SVG; nothing is loaded from outside the project, and no script is needed
    assert html.count("<svg") >= 5
    assert not re.search(r'<script[^>]+src="https?://', html)
    assert not re.search(r'<link[^>]+href="https?://', html)
    # the usual model list is still there
    assert "/admin/jobs/job/" in html


def test_dashboard_without_alerts_says_so(admin_client, world):
    world.publish()
    html = admin_client.get("/admin/").content.decode()
    assert "No alerts" in html


def test_auto_refresh_is_a_meta_refresh(admin_client, broker):
    html = admin_client.get("/admin/?refresh=15").content.decode()
    assert '<meta http-equiv="refresh" content="15">' in html
    assert 'http-equiv="refresh"' not in admin_client.get("/admin/?refresh=7").content.decode()


def test_per_minute_figures_come_from_the_maintained_statistics(broker):
    finish("c2", 4, DELIVERED)
    finish("c2", 1, QUEUED)  # a failed attempt, retried
    finish("c2", 1, DEAD)
    c2 = consumer_stats(dashboard_snapshot(), "c2")
    s = c2.series
    assert len(s.delivered) == MINUTES
    # (the test runs in one transaction, so in one minute by the database clock; sum the window anyway)
    assert sum(s.delivered) == 4 and sum(s.retried) == 1 and sum(s.dead) == 1
    assert sum(s.failed) == 2
    assert sum(s.created) == 10  # the publishes
    assert c2.failure_rate == pytest.approx(2 / 6)
    assert (c2.queued, c2.inflight, c2.delivered, c2.dead) == (5, 0, 4, 1)
    # the backlog rebuilt from the flows ends at the current value
    assert s.backlog(c2.backlog_now)[-1] == 5


def test_requeue_counts_as_requeued_not_as_an_attempt(broker):
    from jobs.models import Job

    dead = list(Job.objects.filter(consumer__consumer_id="c1", status=DEAD).values_list("id", flat=True))
    before = consumer_stats(dashboard_snapshot(), "c1").series
    jobs_requeue_dead(consumer_pk=consumer_pk("c1"), job_ids=dead)
    after = consumer_stats(dashboard_snapshot(), "c1").series
    assert sum(after.requeued) - sum(before.requeued) == 2
    assert sum(after.delivered) == sum(before.delivered) and sum(after.failed) == sum(before.failed)


def test_a_pull_retry_of_a_dead_job_counts_as_requeued(broker):
    from tests.web.admin.conftest import dead_ids

    before = consumer_stats(dashboard_snapshot(), "c1")
    job = dead_ids()[0]
    assert job_move(job_id=job, from_status=DEAD, to_status=INFLIGHT, reason="pull",
                          timeout=30, retry_inc=1)
    after = consumer_stats(dashboard_snapshot(), "c1")
    assert sum(after.series.requeued) - sum(before.series.requeued) == 1
    assert after.backlog_now - before.backlog_now == 1
    assert after.series.backlog(after.backlog_now)[-1] == after.backlog_now


def test_claims_leave_no_statistics_rows(broker):
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM jobs_minutestat WHERE consumer_id = %s", [consumer_pk("c2")])
        before = cur.fetchone()[0]
        jobs_claim(consumer_pk=consumer_pk("c2"), limit=5)
        cur.execute("SELECT count(*), sum(delivered + retried + dead + requeued) FROM jobs_minutestat "
                    "WHERE consumer_id = %s", [consumer_pk("c2")])
        after, moved = cur.fetchone()
    assert after == before and moved == 0


def test_query_count_does_not_grow_with_consumers(admin_client, broker, make):
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get("/admin/").status_code == 200
    for i in range(5):
        make.consumer(f"extra{i}", type="pull", token=f"t{i}", callback=None)
    make.publish()
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get("/admin/").status_code == 200
    assert len(many.captured_queries) == len(few.captured_queries)


def test_no_query_counts_the_job_table(admin_client, broker):
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get("/admin/")
    for q in ctx.captured_queries:
        sql = q["sql"].lower()
        if "jobs_job" in sql and "count(" in sql:
            assert "limit" in sql, sql  # only bounded counts


def test_alert_backlog_growing(broker, make):
    for i in range(12):
        make.publish(HTTP_X_BROKER_MESSAGE_ID=f"g{i}")
    c2 = consumer_stats(dashboard_snapshot(), "c2")
    assert c2.backlog_growth == 22
    assert "backlog" in [a.kind for a in c2.alerts]


def test_alert_failing_consumer(broker):
    finish("c2", 5, QUEUED)
    finish("c2", 1, DELIVERED)
    alerts = {a.kind: a for a in consumer_stats(dashboard_snapshot(), "c2").alerts}
    assert alerts["failing"].level == "error" and "83% of 6 attempts failed" in alerts["failing"].text


def test_alert_stalled_backlog(broker):
    with connection.cursor() as cur:  # test setup: age the queued jobs (not a status change)
        cur.execute("UPDATE jobs_job SET created_at = now() - interval '2 hours' WHERE consumer_id = %s",
                    [consumer_pk("c2")])
    c2 = consumer_stats(dashboard_snapshot(), "c2")
    assert c2.oldest_queued_age > 7000
    assert "stalled" in [a.kind for a in c2.alerts]
    # c1 delivered in the last minutes: not stalled even with old jobs
    with connection.cursor() as cur:
        cur.execute("UPDATE jobs_job SET created_at = now() - interval '2 hours' WHERE consumer_id = %s",
                    [consumer_pk("c1")])
    assert "stalled" not in [a.kind for a in consumer_stats(dashboard_snapshot(), "c1").alerts]


def test_alert_overdue_inflight_means_the_sweep_is_not_running(admin_client, broker):
    with connection.cursor() as cur:  # test setup: a deadline long past, as if no sweep ran
        cur.execute("UPDATE jobs_job SET deadline = now() - interval '10 minutes' WHERE status = %s",
                    [INFLIGHT])
    dash = dashboard_snapshot()
    assert dash.overdue_inflight == 1
    assert dash.alerts[0].kind == "overdue" and dash.alerts[0].level == "error"
    assert "timeout sweep" in admin_client.get("/admin/").content.decode()


def test_alert_rules_are_pluggable(broker):

    @alert_rule
    def paused(stats):  # what the flow-control feature will add
        if stats.consumer.consumer_id == "c2":
            yield Alert("warning", "paused", "consumer paused")

    try:
        assert "paused" in [a.kind for a in consumer_stats(dashboard_snapshot(), "c2").alerts]
    finally:
        ALERT_RULES.remove(paused)


def test_admin_site_status_constants_match_the_model():
    from jobs.models import JobStatus
    from web import site as admin_site

    assert (admin_site.QUEUED, admin_site.INFLIGHT, admin_site.DELIVERED, admin_site.DEAD) == (
        JobStatus.QUEUED, JobStatus.INFLIGHT, JobStatus.DELIVERED, JobStatus.DEAD)


def test_channel_filter_for_the_snapshot(broker, make):
    make.channel("other", token="o-token")
    dash = dashboard_snapshot(channel_pks=[])
    assert dash.channels == []
    assert [ch.channel.channel_id for ch in dashboard_snapshot().channels] == ["ch1", "other"]


def test_alert_pin_changing_often(broker):
    from consumers.models import Consumer

    c2 = Consumer.objects.select_related("channel").get(consumer_id="c2")
    ids = {"channel": c2.channel.channel_id, "consumer": c2.consumer_id, "consumer_pk": c2.pk}
    for i in range(3):
        advisory_record(type="consumer_group_pinned", group="A", data={"pinned_id": f"pin{i}"}, **ids)
    assert "pin-churn" not in [a.kind for a in consumer_stats(dashboard_snapshot(), "c2").alerts]
    advisory_record(type="consumer_group_pinned", group="A", data={"pinned_id": "pin3"}, **ids)
    alerts = {a.kind: a for a in consumer_stats(dashboard_snapshot(), "c2").alerts}
    assert "4 pins in the last hour" in alerts["pin-churn"].text


# --- "delivered / min": one source of truth with the chart ---------------------------------------------

def test_rate_is_the_charts_last_bars_over_the_time_they_cover():

    s = Series()
    s.delivered[-1] = 21  # deliveries in the current minute only, as the issue saw: chart 21, card 0.0
    assert s.per_minute("delivered", RATE_MINUTES, elapsed=30.0) == pytest.approx(21 / 4.5)
    s.delivered[-5:] = [60, 60, 60, 60, 10]  # steady 60/min, 10 s into the current minute
    assert s.per_minute("delivered", RATE_MINUTES, elapsed=10.0) == pytest.approx(250 / (4 + 10 / 60))
    s.delivered[-6] = 1000  # a bar outside the window does not count
    assert s.per_minute("delivered", RATE_MINUTES, elapsed=60.0) == pytest.approx(250 / 5)


def test_delivered_per_minute_card_agrees_with_its_chart(admin_client, broker):

    finish("c2", 4, DELIVERED)  # delivered now: in the chart's current (last) minute
    dash = dashboard_snapshot()
    c2 = consumer_stats(dash, "c2")
    elapsed = dash.now.second + dash.now.microsecond / 1e6
    bars = c2.series.delivered[-RATE_MINUTES:]
    assert bars[-1] >= 4
    assert c2.delivered_per_minute > 0
    assert c2.delivered_per_minute == pytest.approx(sum(bars) / (RATE_MINUTES - 1 + max(elapsed, 1.0) / 60))
    total = sum(c.delivered_per_minute for c in dash.consumers)
    assert total == pytest.approx(dash.series.per_minute("delivered", RATE_MINUTES, elapsed))
    # the page's card shows that figure (the test's transaction keeps the database clock still)
    html = admin_client.get("/admin/").content.decode()
    card = re.search(r'id="total-rate"><span class="n">([\d.,]+)</span>', html).group(1)
    assert card == floatformat(total, "1g") and float(card) > 0
    row = re.search(r'data-consumer="ch1/c2">(.*?)</tr>', html, re.S).group(1)
    assert f'<td class="num">{floatformat(c2.delivered_per_minute, "1g")}</td>' in row


def test_the_admin_says_advisories(admin_client, db):
    html = admin_client.get("/admin/").content.decode()
    assert "Advisories" in html and "Advisorys" not in html
    assert "Advisories" in admin_client.get("/admin/consumers/advisory/").content.decode()
