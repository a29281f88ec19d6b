"""The portal's pages over HTTP (Django's test client): opening a link, what each page shows, what
a session may reach (its consumer only), read links, CSRF, the rate limit, the endpoint form's
checks, and the advisories recording every change. The browser test walks the same pages with
real deliveries (test_portal_browser.py)."""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone

import pytest
from django.test import Client

from broker.xid import job_xid
from consumers.models import Advisory, Consumer
from jobs.callbacks.probe import address_public
from tests.jobs.conftest import Reply
from web.portal.models import PortalReplay, PortalSession
from web.portal.replays import portal_replay_run
from web.portal.rules import TEST_EVENTS_PER_MINUTE
from jobs.models import DeliveryAttempt, Job, JobStatus
from jobs.state.transitions import DEAD
from tests.web.admin.conftest import finish
from tests.web.portal.conftest import link_make, link_open, link_path

pytestmark = pytest.mark.django_db
HOME = "/portal/channel/ch1/consumer/c1/"


def opened(api, consumer="/channel/ch1/consumer/c1", **data) -> tuple[Client, str]:
    """A browser-like client holding a portal session of the link it opened; and the link's token."""
    body = link_make(api, consumer, **data)
    client = Client()
    r = link_open(client, body)
    assert r.status_code == 302, r.content
    return client, body["URL"].rsplit("/", 1)[1]


@pytest.fixture
def dead_world(world):
    for i in range(3):
        assert world.publish(body=f'{{"n": {i}}}'.encode(), HTTP_X_BROKER_MESSAGE_ID=f"m{i}").status_code == 201
    return finish("c1", 2, DEAD)  # two dead letters (moved by the status writers), one queued


def test_following_a_link_makes_no_session_until_the_button_is_pressed(world, api):
    """A mail scanner or a chat's link preview GETs the link: no session is made (nor by the GET
    of the page it lands on); the person's POST makes it."""
    body = link_make(api)
    token = body["URL"].rsplit("/", 1)[1]
    scanner = Client()
    r = scanner.get(link_path(body))
    assert r.status_code == 302 and r["Location"] == "/portal/open" and "broker_portal" not in r.cookies
    pending = r.cookies["broker_portal_link"]
    assert pending["path"] == "/portal/open" and pending["httponly"] and int(pending["max-age"]) <= 600
    page = scanner.get("/portal/open")
    assert page.status_code == 200 and "broker_portal" not in page.cookies
    html = page.content.decode()
    assert "consumer <strong>c1</strong> on channel\n<strong>ch1</strong>" in html and token not in html
    assert re.search(r'<form method="post" action="/portal/open"', html) and ">Open the portal</button>" in html
    assert PortalSession.objects.count() == 0
    assert scanner.get(HOME).status_code == 403  # nothing open
    assert Client().get("/portal/open").status_code == 403  # no link followed: nothing to open
    assert Client().post("/portal/open").status_code == 403
    r = scanner.post("/portal/open")
    assert r.status_code == 302 and r["Location"] == HOME and PortalSession.objects.count() == 1
    assert r.cookies["broker_portal_link"].value == ""  # the token's cookie goes
    assert scanner.get(HOME).status_code == 200


def test_opening_a_link_sets_a_portal_cookie_and_leaves_the_token_behind(world, api):
    body = link_make(api)
    token = body["URL"].rsplit("/", 1)[1]
    client = Client()
    r = link_open(client, body)
    assert r.status_code == 302 and r["Location"] == HOME and token not in r["Location"]
    cookie = r.cookies["broker_portal"]
    assert cookie["path"] == "/portal/" and cookie["httponly"] and cookie["samesite"] == "Lax"
    assert cookie.value != token
    assert r["Cache-Control"] == "no-store" and r["Referrer-Policy"] == "same-origin"
    page = client.get(HOME)
    assert page.status_code == 200
    html = page.content.decode()
    nav = re.search(r'<nav class="portal-nav".*?</nav>', html, re.S).group(0)
    assert re.findall(r">([^<]+)</a>", nav) == ["Overview", "Deliveries", "Dead letters", "Replay", "Endpoint",
                                                "Event catalog"]
    for path in ("deliveries", "dead-letters", "replay", "endpoint", "event-catalog"):
        r = client.get(f"{HOME}{path}")
        assert r.status_code == 200, path
        assert token not in r.content.decode() and all(token not in v for v in r.headers.values())
    assert token not in html and cookie.value not in html


def test_without_an_open_session_every_page_is_a_plain_403(world, api):
    for path in (HOME, f"{HOME}deliveries", "/portal/channel/ch1/consumer/c2/", "/portal/channel/zz/consumer/zz/"):
        r = Client().get(path)
        assert r.status_code == 403 and b"portal link" in r.content and b"c1" not in r.content, path
    r = Client().get("/portal/open/not-a-token")
    assert r.status_code == 403 and b"portal link" in r.content and "broker_portal" not in r.cookies


def test_another_consumer_or_channel_is_the_same_404_as_nothing(world, api, dead_world):
    client, _ = opened(api)
    other_job = Job.objects.filter(consumer__consumer_id="c2").values_list("pk", flat=True).first()
    answers = [client.get(p) for p in (
        "/portal/channel/ch1/consumer/c2/", "/portal/channel/ch1/consumer/c2/dead-letters",
        "/portal/channel/ch1/consumer/nobody/", "/portal/channel/ch2/consumer/c1/",
        f"{HOME}deliveries/{job_xid(other_job)}", f"{HOME}deliveries/not-a-job", "/portal/elsewhere",
        f"{HOME}no-such-page")]
    assert {r.status_code for r in answers} == {404}
    assert len({r.content for r in answers}) == 1  # one page for all: nothing told apart
    assert b"c2" not in answers[0].content and b"ch1" not in answers[0].content
    assert client.post("/portal/channel/ch1/consumer/c2/dead-letters/requeue-all").status_code == 404
    assert Job.objects.filter(consumer__consumer_id="c2", status=JobStatus.QUEUED).count() == 3


def test_a_read_link_shows_everything_and_no_form(world, api, dead_world):
    client, _ = opened(api, scope="read")
    for path in ("", "deliveries", "dead-letters", "replay", "endpoint", f"deliveries/{job_xid(dead_world[0])}"):
        r = client.get(f"{HOME}{path}")
        assert r.status_code == 200 and r.content.count(b"<form") == 1 and b'id="sign-out"' in r.content, path
    assert b"Read-only" in client.get(HOME).content
    assert job_xid(dead_world[0]).encode() in client.get(f"{HOME}dead-letters").content
    for path in ("dead-letters/requeue-all", "endpoint/rotate-secret", "endpoint/test-event", "replay", "endpoint"):
        r = client.post(f"{HOME}{path}", {"job": job_xid(dead_world[0])})
        assert r.status_code == 403 and b"Read-only" in r.content, path
    assert client.get(f"{HOME}dead-letters/requeue-all").status_code == 403
    assert Job.objects.filter(consumer__consumer_id="c1", status=DEAD).count() == 2


def test_forms_need_the_csrf_token(world, api, dead_world):
    body = link_make(api)
    client = Client(enforce_csrf_checks=True)
    assert client.get(link_path(body)).status_code == 302
    assert client.post("/portal/open").status_code == 403  # the opening button too
    start = client.get("/portal/open").content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', start).group(1)
    assert client.post("/portal/open", {"csrfmiddlewaretoken": csrf}).status_code == 302
    assert client.post(f"{HOME}dead-letters/requeue-all").status_code == 403
    page = client.get(f"{HOME}dead-letters/requeue-all")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    r = client.post(f"{HOME}dead-letters/requeue-all", {"csrfmiddlewaretoken": csrf})
    assert r.status_code == 302 and not Job.objects.filter(consumer__consumer_id="c1", status=DEAD).exists()


def test_opening_links_is_rate_limited_per_address(world, api, settings):
    settings.BROKER_PORTAL_OPENS_PER_MINUTE = 2
    body = link_make(api)
    assert Client().get(link_path(body)).status_code == 302  # followed: counted as an opening
    assert Client().get("/portal/open/guess").status_code == 403
    r = Client().get(link_path(body))
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60 and "broker_portal" not in r.cookies
    assert Client(REMOTE_ADDR="10.9.8.7").get(link_path(body)).status_code == 302  # another address


def test_dead_letters_are_listed_and_requeued_one_by_one_with_an_advisory(world, api, dead_world):
    client, _ = opened(api)
    first, second = dead_world
    page = client.get(f"{HOME}dead-letters").content.decode()
    assert job_xid(first) in page and job_xid(second) in page and "Requeue all" in page
    r = client.post(f"{HOME}dead-letters/requeue", {"job": job_xid(first)})
    assert r.status_code == 302 and Job.objects.get(pk=first).status == JobStatus.QUEUED
    assert Job.objects.get(pk=second).status == JobStatus.DEAD
    link = Advisory.objects.get(type="portal_dead_requeued")
    assert link.data["jobs"] == [job_xid(first)] and link.data["requeued"] == 1 and "link" in link.data
    assert "Requeued job" in client.get(f"{HOME}dead-letters").content.decode()
    other = Job.objects.filter(consumer__consumer_id="c2").first()  # another consumer's job is left alone
    client.post(f"{HOME}dead-letters/requeue", {"job": job_xid(other.pk)})
    assert Job.objects.get(pk=other.pk).status == other.status


def test_deliveries_list_attempts_newest_first_filtered_by_outcome(world, api, dead_world):
    client, _ = opened(api)
    now = datetime.now(timezone.utc)
    for n, (code, outcome, excerpt) in enumerate([(500, "failed", "boom"), (204, "delivered", ""),
                                                 (None, "timeout", "")], start=1):
        DeliveryAttempt.objects.create(job_id=dead_world[0], attempt=n, started_at=now, duration_ms=10.0 * n,
                                       status_code=code, outcome=outcome, response_excerpt=excerpt,
                                       error="timeout after 2s" if outcome == "timeout" else "")
    html = client.get(f"{HOME}deliveries").content.decode()
    rows = re.findall(r'<tr class="outcome-(\w+)">', html)
    assert rows == ["timeout", "delivered", "failed"] and "boom" in html and "timeout after 2s" in html
    assert re.findall(r'<tr class="outcome-(\w+)">', client.get(f"{HOME}deliveries?outcome=failed").content.decode()) \
        == ["failed"]
    overview = client.get(HOME).content.decode()
    assert re.search(r"Last hour</th><td class=\"num\">3</td><td class=\"num\">1</td>", overview)
    job = client.get(f"{HOME}deliveries/{job_xid(dead_world[0])}").content.decode()
    assert "boom" in job and "DEAD" in job and "&quot;n&quot;: 0" in job  # attempts, state, payload


def test_the_endpoint_form_checks_as_the_api_and_records_the_change(world, api):
    client, _ = opened(api)
    page = client.get(f"{HOME}endpoint").content.decode()
    for label in ("Callback URL", "Filter", "Message types", "Max deliveries per second"):
        assert re.search(rf"<label for=\"[^\"]+\">{label}</label>", page), label
    assert "Save endpoint" in page and "Rotate secret" in page and "Send test event" in page
    loaded = re.search(r'name="loaded_at" value="(\d+)"', page).group(1)
    form = {"callback_url": "http://127.0.0.1:9/new", "filter": '{"body": {"a": {"$regex": "x"}}}',
            "message_types": "", "max_deliveries_per_second": "", "loaded_at": loaded}
    r = client.post(f"{HOME}endpoint", form)
    assert r.status_code == 200 and "body.a.$regex: unknown operator" in r.content.decode()
    r = client.post(f"{HOME}endpoint", {**form, "filter": "", "callback_url": "http://10.1.2.3/hook"})
    assert r.status_code == 200 and "not allowed" in r.content.decode()
    assert Consumer.objects.get(consumer_id="c1").callback_url == "http://127.0.0.1:9/cb"
    r = client.post(f"{HOME}endpoint", {**form, "filter": '{"body": {"kind": "order"}}', "message_types": "order.*",
                                        "max_deliveries_per_second": "5"})
    assert r.status_code == 302
    c1 = Consumer.objects.get(consumer_id="c1")
    assert (c1.callback_url, c1.filter, c1.message_types, c1.max_deliveries_per_second) == (
        "http://127.0.0.1:9/new", {"body": {"kind": "order"}}, ["order.*"], 5.0)
    advisory = Advisory.objects.get(type="portal_endpoint_updated")
    assert advisory.consumer_id == "c1" and "callback_url" in advisory.data["fields"]
    r = client.post(f"{HOME}endpoint", form | {"filter": ""})  # the page was loaded before that change
    assert r.status_code == 200 and "changed since you opened this page" in r.content.decode()


def test_a_pull_consumer_has_no_endpoint_page(world, api):
    client, _ = opened(api, "/channel/ch1/consumer/c2")
    home = "/portal/channel/ch1/consumer/c2/"
    html = client.get(home).content.decode()
    assert ">Endpoint<" not in html and ">Replay<" in html
    assert client.get(f"{home}endpoint").status_code == 404
    assert client.post(f"{home}endpoint/rotate-secret").status_code == 404


@pytest.mark.parametrize("value", ["a\x00b", "x" * 500, "", "%ff%fe", "é"])
def test_a_malformed_cookie_or_token_is_a_plain_403(world, value):
    client = Client()
    client.cookies["broker_portal"] = value
    r = client.get(HOME)
    assert r.status_code == 403 and b"portal link" in r.content
    r = Client().get(f"/portal/open/{value.replace(chr(0), '%00') or 'x'}")
    assert r.status_code == 403 and b"portal link" in r.content


def test_the_token_never_reaches_the_logs_even_when_opening_fails(world, api, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.request")  # its 4xx warnings too, which settings silence
    body = link_make(api)
    token = body["URL"].rsplit("/", 1)[1]
    client, _ = opened(api)
    assert Client().get(link_path(body)).status_code == 302
    api.delete("/channel/ch1/consumer/c1/portal-links")
    assert Client().get(link_path(body)).status_code == 403
    monkeypatch.setattr("web.portal.access.portal_link_check", lambda **kw: 1 / 0)
    r = Client().get(link_path(body))
    assert r.status_code == 500 and b"Traceback" not in r.content and b"ZeroDivision" not in r.content
    assert "opening a portal link failed" in caplog.text and "ZeroDivisionError" in caplog.text
    assert token not in caplog.text and "/portal/open/" not in caplog.text


def test_a_session_left_idle_ends_and_sign_out_ends_it_at_once(world, api, settings):
    """``BROKER_PORTAL_IDLE`` after the last request (``last_seen_at``, written at most once a
    minute) the session is refused; "Sign out" ends it now, a read link's too."""
    settings.BROKER_PORTAL_IDLE = timedelta(minutes=30)
    client, _ = opened(api)
    assert client.get(HOME).status_code == 200
    session = PortalSession.objects.get()
    PortalSession.objects.update(last_seen_at=session.last_seen_at - timedelta(minutes=29))
    assert client.get(HOME).status_code == 200  # 29 minutes: still open, and seen again now
    assert PortalSession.objects.get().last_seen_at > session.last_seen_at - timedelta(minutes=1)
    PortalSession.objects.update(last_seen_at=session.last_seen_at - timedelta(minutes=31))
    r = client.get(HOME)
    assert r.status_code == 403 and b"ended after 30m without activity" in r.content
    assert client.get(f"{HOME}deliveries").status_code == 403  # (idle stays idle: a refusal marks nothing seen)

    reader, _ = opened(api, scope="read")
    assert b">Sign out</button>" in reader.get(HOME).content
    r = reader.post(f"{HOME}sign-out")
    assert r.status_code == 200 and b"signed out" in r.content and r.cookies["broker_portal"].value == ""
    assert PortalSession.objects.filter(revoked_at__isnull=False).count() == 1
    reader.cookies["broker_portal"] = r.wsgi_request.COOKIES["broker_portal"]  # a copy of the old cookie
    assert reader.get(HOME).status_code == 403


def test_test_events_are_rate_limited_per_consumer_and_a_private_answer_shows_no_body(world, api, receiver,
                                                                                       monkeypatch):
    monkeypatch.setattr("web.portal.links.rate_minute", lambda now: 30_000_000)  # one minute's window throughout
    receiver.behave("/cb", lambda n, r: Reply(200, body=b"internal secret"))
    Consumer.objects.filter(consumer_id="c1").update(callback_url=receiver.url("/cb"))
    client, _ = opened(api)
    other, _ = opened(api)  # another session of the same consumer shares the limit
    for _ in range(TEST_EVENTS_PER_MINUTE):
        page = client.post(f"{HOME}endpoint/test-event")
        assert page.status_code == 200
    html = page.content.decode()
    assert 'id="test-event-status">200<' in html and " ms<" in html
    assert "internal secret" not in html and "private address" in html  # 127.0.0.1 answered
    r = other.post(f"{HOME}endpoint/test-event")
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60 and b"Too many test events" in r.content
    assert len(receiver.at("/cb")) == TEST_EVENTS_PER_MINUTE


@pytest.mark.parametrize("address, public", [("93.184.216.34", True), ("2606:2800:220:1::1", True),
                                             ("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.9", False),
                                             ("169.254.169.254", False), ("100.64.0.1", False), ("::1", False),
                                             ("fd00::1", False), ("::ffff:10.0.0.1", False), ("", False)])
def test_only_a_public_address_answer_is_shown(address, public):
    assert address_public(address) is public


def delivered_and_opened(world, api, monkeypatch, n: int, *, prefix: str):
    """``n`` messages published and delivered to c1, the portal opened, and replays queued to a
    list instead of the cluster (one that has not run them yet): (client, that list)."""
    for i in range(n):
        assert world.publish(body=f'{{"n": {i}}}'.encode(), HTTP_X_BROKER_MESSAGE_ID=f"{prefix}{i}").status_code == 201
    finish("c1", n, JobStatus.DELIVERED)
    client, _ = opened(api)
    queued: list = []
    monkeypatch.setattr("web.portal.replays._enqueue", queued.append)
    return client, queued


def test_a_replay_runs_as_a_task_one_at_a_time_per_consumer(world, api, monkeypatch):
    client, queued = delivered_and_opened(world, api, monkeypatch, 3, prefix="r")
    since = {"since": "2020-01-01T00:00", "until": "", "only_failed": ""}
    r = client.post(f"{HOME}replay", since)
    assert r.status_code == 302 and len(queued) == 1
    replay = PortalReplay.objects.get()
    assert replay.state == "queued" and replay.until is not None  # the window's end fixed when asked
    assert Job.objects.filter(consumer__consumer_id="c1", status=JobStatus.DELIVERED).count() == 3  # nothing yet
    page = client.post(f"{HOME}replay", since)  # one at a time
    assert page.status_code == 200 and b"already queued or running" in page.content and len(queued) == 1

    assert portal_replay_run(replay.pk).endswith("3 replayed, 0 skipped")  # the task (the cluster runs it)
    replay.refresh_from_db()
    assert (replay.state, replay.replayed) == ("done", 3)
    assert Job.objects.filter(consumer__consumer_id="c1", status=JobStatus.QUEUED).count() == 3
    advisory = Advisory.objects.get(type="replay")
    assert advisory.data["source"] == f"portal link {replay.link_id}" and advisory.data["replayed"] == 3
    html = client.get(f"{HOME}replay").content.decode()
    assert re.search(r'<tr class="replay-done"><td>\d+</td><td>done</td>', html)
    assert client.post(f"{HOME}replay", since).status_code == 302 and len(queued) == 2  # the next one may start


def test_a_replay_goes_on_in_turns_and_a_stale_one_does_not_block(world, api, monkeypatch):
    client, queued = delivered_and_opened(world, api, monkeypatch, 5, prefix="t")
    monkeypatch.setattr("web.portal.replays.TURN", 0.0)  # a turn per chunk
    monkeypatch.setattr("jobs.publish.replay.CHUNK", 2)
    monkeypatch.setattr("jobs.publish.replay.PAUSE", 0.0)
    real = consumer_replay_real = __import__("jobs.publish.replay", fromlist=["x"]).consumer_replay
    monkeypatch.setattr("web.portal.replays.consumer_replay", lambda **kw: consumer_replay_real(**{**kw, "chunk": 2}))
    assert client.post(f"{HOME}replay", {"since": "2020-01-01T00:00"}).status_code == 302
    pk = queued.pop()
    turns = 0
    while True:
        outcome = portal_replay_run(pk)
        turns += 1
        if not queued:
            break
        assert queued.pop() == pk and "next turn queued" in outcome
    assert turns == 3 and outcome.endswith("5 replayed, 0 skipped") and real is consumer_replay_real
    assert Advisory.objects.filter(type="replay").count() == 1  # one advisory, with the totals
    assert Advisory.objects.get(type="replay").data["replayed"] == 5

    PortalReplay.objects.create(consumer_id=Consumer.objects.get(consumer_id="c1").pk, since=datetime(2020, 1, 1,
                                tzinfo=timezone.utc), until=datetime.now(timezone.utc), state="running",
                                created_at=datetime.now(timezone.utc) - timedelta(hours=1),
                                updated_at=datetime.now(timezone.utc) - timedelta(hours=1))  # its task died
    assert client.post(f"{HOME}replay", {"since": "2020-01-01T00:00"}).status_code == 302
    assert PortalReplay.objects.filter(state="failed", error__contains="a worker stopped").count() == 1


def test_times_read_as_people_read_them(world, api):
    client, _ = opened(api)
    Advisory.objects.all().delete()
    client.post(f"{HOME}replay", {"since": "2020-01-01T00:00"})
    html = client.get(f"{HOME}replay").content.decode()
    assert not re.search(r">\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z<", html)  # no raw RFC 3339 shown
    shown = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC '
                       r'<span class="ago">\(([^)]+)\)</span></time>', html)
    assert shown, html
    assert any(ago == "just now" or ago.endswith(" s ago") for _, _, _, ago in shown)  # asked a moment ago
    assert any(ago.endswith("years ago") or "days ago" in ago for _, _, _, ago in shown)  # since 2020
    full, title, text, _ = shown[0]
    assert full == title and full.startswith(text.replace(" ", "T"))
    assert "in 59 min" in client.get(HOME).content.decode()  # the link's end, ahead
