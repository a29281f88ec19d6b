"""The delivery portal end to end in headless Chromium (Debian's package, driven by Playwright; the
admin e2e tests' launch settings), against the live server, a real push dispatcher loop and a real
HTTP receiver on 127.0.0.1. A team follows its link and presses "Open the portal", sees its endpoint
failing (times in whole seconds, the full value on hover), fixes the callback
URL, requeues its dead letters and sees them delivered, rotates the signing secret (both secrets
verify during the grace period, with the standardwebhooks package), sends a test event (status and
timing only: the receiver is on a private address), replays (a task) and signs out; a read
link has no form, another consumer's pages are out of reach, and revocation ends an open session.
Every control is found by its role and accessible name. Screenshots go to artifacts/ (git-ignored).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from standardwebhooks import Webhook

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402 (after the skip)

from consumers.models import Advisory, Consumer
from jobs.models import Job, JobStatus
from jobs.state.transitions import DEAD
from tests.jobs.conftest import Reply
from tests.web.admin.conftest import chromium_missing, finish
from tests.web.portal.conftest import link_make, link_path

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),  # the live server's and the dispatcher's threads see committed rows
    pytest.mark.skipif(chromium_missing(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]
PAGES = ("Overview", "Deliveries", "Dead letters", "Replay", "Endpoint", "Event catalog")


def jobs_in(status: int, consumer: str = "c1") -> int:
    return Job.objects.filter(consumer__consumer_id=consumer, status=status).count()


UNNAMED = """() => [...document.querySelectorAll("input:not([type=hidden]), select, textarea, button")]
    .filter(el => !(el.labels && el.labels.length) && !el.getAttribute("aria-label") && !el.textContent.trim())
    .map(el => el.outerHTML)"""


def nav(page, name: str) -> None:
    page.get_by_role("navigation", name="Portal pages").get_by_role("link", name=name, exact=True).click()
    expect(page.locator("h1")).to_have_text(name)


def test_a_team_fixes_its_endpoint_and_recovers_its_dead_letters(page, live_server, make, api, receiver, dispatcher,
                                                                 artifacts):
    page.set_default_timeout(15_000)
    receiver.behave("/down", lambda n, r: Reply(503, body=b"down for maintenance"))
    receiver.behave("/up", lambda n, r: Reply(200, body=b"thanks"))
    make.basics().consumer("c1", callback=receiver.url("/down"), maxRetry="1", retryBackoff="0.1",
                           circuitBreakerFailures="0")
    old_secret = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    dispatcher()
    for i in range(3):
        assert make.publish(body=f'{{"order": {i}}}'.encode(), HTTP_X_BROKER_MESSAGE_ID=f"m{i}").status_code == 201
    receiver.wait(lambda: jobs_in(DEAD) == 3, what="3 dead letters")

    # following the link opens nothing by itself (a mail scanner's GET); the button opens the
    # overview, and the token is gone from the address bar
    link = link_make(api)
    page.goto(live_server.url + link_path(link))
    assert page.url == f"{live_server.url}/portal/open"
    assert "consumer c1 on channel ch1" in page.locator("#portal-start").inner_text()
    assert "broker_portal" not in {c["name"] for c in page.context.cookies(live_server.url + "/portal/")}
    page.get_by_role("button", name="Open the portal").click()
    expect(page).to_have_url(f"{live_server.url}/portal/channel/ch1/consumer/c1/")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator("#dead-count").inner_text() == "3"
    assert [a.inner_text() for a in page.get_by_role("navigation", name="Portal pages").get_by_role("link").all()] \
        == list(PAGES)

    # the failing endpoint, seen failing
    nav(page, "Deliveries")
    failed = page.locator("#attempts tbody tr.outcome-failed")
    assert failed.count() == 6  # 3 messages x (first attempt + 1 retry)
    assert "503" in failed.first.inner_text() and "down for maintenance" in failed.first.inner_text()
    # times in whole seconds with a relative hint; the full value on hover
    when = failed.first.locator("time")
    assert when.get_attribute("title").endswith("Z") and "." in when.get_attribute("title")
    shown = when.inner_text()  # under a second old on a quick machine: "just now", else "3 s ago"
    assert " UTC (" in shown and (shown.endswith(" ago)") or shown.endswith("(just now)")) and "." not in shown
    when.hover()  # (the browser shows the title as its tooltip)
    page.screenshot(path=str(artifacts / "portal-deliveries.png"), full_page=True)
    failed.first.get_by_role("link").click()
    assert "DEAD" in page.locator("#job-fields").inner_text()
    assert "503" in page.locator("#job-attempts").inner_text() and "push" in page.locator("#job-history").inner_text()
    assert "order" in page.locator("#job-payload").inner_text()

    # the URL fixed in the portal
    nav(page, "Endpoint")
    assert page.evaluate(UNNAMED) == []  # every control has an accessible name
    page.get_by_label("Callback URL", exact=True).fill(receiver.url("/up"))
    page.get_by_role("button", name="Save endpoint").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Endpoint saved.")
    assert Consumer.objects.get(consumer_id="c1").callback_url == receiver.url("/up")

    # dead letters: one requeued, then all (after a confirmation), and delivered
    nav(page, "Dead letters")
    rows = page.locator("#dead-letters tbody tr")
    assert rows.count() == 3 and page.evaluate(UNNAMED) == []
    rows.first.get_by_role("button", name="Requeue", exact=True).click()
    expect(page.locator("ul.messagelist")).to_contain_text("Requeued job")
    receiver.wait(lambda: len(receiver.at("/up")) == 1 and jobs_in(JobStatus.DELIVERED) == 1, what="one redelivery")
    page.get_by_role("button", name="Requeue all", exact=True).click()
    assert "Requeue every dead letter" in page.locator("#content").inner_text()
    page.get_by_role("button", name="Yes, requeue all").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Requeued 2 dead letters.")
    receiver.wait(lambda: jobs_in(JobStatus.DELIVERED) == 3, what="all three delivered")
    assert len(receiver.at("/up")) == 3 and jobs_in(DEAD) == 0
    page.reload()
    assert "No dead letters." in page.locator("#dead-letters").inner_text()

    # the secret rotated: shown once, and both secrets verify during the grace period
    nav(page, "Endpoint")
    page.get_by_role("button", name="Rotate secret").click()
    new_secret = page.locator("#secret-value").inner_text()
    assert new_secret.startswith("whsec_") and new_secret != old_secret
    assert Consumer.objects.get(consumer_id="c1").signing_secret == new_secret
    page.screenshot(path=str(artifacts / "portal-secret-rotated.png"), full_page=True)
    assert make.publish(body=b'{"order": 99}', HTTP_X_BROKER_MESSAGE_ID="m99").status_code == 201
    [delivery] = receiver.wait(lambda: [r for r in receiver.at("/up") if r.body == b'{"order": 99}'], what="delivery")
    for secret in (old_secret, new_secret):
        assert Webhook(secret).verify(delivery.body, delivery.headers) == {"order": 99}

    # a test event: its status and timing on the page (its body not: 127.0.0.1 is a private
    # address), signed with both secrets too
    page.get_by_role("button", name="Send test event").click()
    assert page.locator("#test-event-status").inner_text() == "200"
    assert page.locator("#test-event-body").count() == 0 and "thanks" not in page.content()
    assert "private address" in page.locator("#test-event-body-hidden").inner_text()
    assert page.locator("#test-event-latency").inner_text().endswith(" ms")
    assert new_secret not in page.content()  # shown once only
    [event] = [r for r in receiver.at("/up") if r.headers.get("x-broker-event") == "test"]
    for secret in (old_secret, new_secret):
        assert Webhook(secret).verify(event.body, event.headers)["type"] == "broker.test"

    # a replay since a time
    nav(page, "Replay")
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert page.evaluate(UNNAMED) == []
    page.get_by_label("Since (UTC)", exact=True).fill(since)
    page.get_by_role("button", name="Replay", exact=True).click()  # a task (run at once by the tests' sync queue)
    expect(page.locator("ul.messagelist")).to_contain_text("done: 4 messages replayed")
    assert "done" in page.locator("#portal-replays tbody tr").first.inner_text()
    assert f"portal link {Advisory.objects.filter(type='portal_endpoint_updated').get().data['link']}" \
        in page.locator("#replays").inner_text()
    receiver.wait(lambda: len(receiver.at("/up")) >= 9, what="the replayed messages")  # 4 + 4 + the test event
    recorded = set(Advisory.objects.filter(consumer_id="c1", type__startswith="portal_").values_list("type", flat=True))
    assert recorded == {"portal_endpoint_updated", "portal_dead_requeued", "portal_secret_rotated", "portal_test_event"}

    # signing out ends the session at once
    page.get_by_role("button", name="Sign out").click()
    assert "signed out" in page.locator("#portal-refusal").inner_text()
    answer = page.goto(live_server.url + "/portal/channel/ch1/consumer/c1/")
    assert answer.status == 403


def test_a_read_link_has_no_form_other_consumers_are_out_of_reach_and_revocation_ends_it(
        browser, live_server, world, api):
    for i in range(2):
        assert world.publish(body=f'{{"n": {i}}}'.encode(), HTTP_X_BROKER_MESSAGE_ID=f"m{i}").status_code == 201
    finish("c1", 1, DEAD)
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(live_server.url + link_path(link_make(api, scope="read")))
    page.get_by_role("button", name="Open the portal").click()
    assert "Read-only link" in page.locator("#user-tools").text_content()
    for name in PAGES:  # everything visible, nothing to change (but signing out)
        nav(page, name)
        assert page.locator("#content form").count() == 0, name
        assert [b.inner_text() for b in page.get_by_role("button").all()] == ["Sign out"], name
    nav(page, "Dead letters")
    assert page.locator("#dead-letters tbody tr").count() == 1

    for url in ("/portal/channel/ch1/consumer/c2/", "/portal/channel/ch1/consumer/c2/dead-letters",
                "/portal/channel/other/consumer/c1/", "/portal/channel/ch1/consumer/nobody/"):
        answer = page.goto(live_server.url + url)
        assert answer.status == 404, url
        assert page.locator("#portal-refusal").inner_text() == "There is no such page in this portal."
        assert "c2" not in page.content() and "Dead letters" not in page.content()

    page.goto(live_server.url + "/portal/channel/ch1/consumer/c1/")
    assert api.delete("/channel/ch1/consumer/c1/portal-links").status_code == 204
    answer = page.reload()
    assert answer.status == 403 and "revoked" in page.locator("#portal-refusal").inner_text()
    context.close()
