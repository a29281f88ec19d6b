"""Sources in the admin end to end in headless Chromium (Debian's package, driven by Playwright; the
admin e2e tests' launch settings), against the live server: an operator creates a GitHub source,
reads its secret once with the address to give the provider, sees the provider's requests counted
by outcome (accepted, duplicate, a refusal with its reason), rotates the secret and disables the
source with the list's actions. The database and the /in/ answers over HTTP are checked after every
step. Screenshots go to artifacts/ (git-ignored)."""

from __future__ import annotations

import pytest
import requests

pytest.importorskip("playwright")

from broker.models import Channel, Message  # noqa: E402 (after the skip)
from sources.models import Source  # noqa: E402
from tests.processes import wait_for  # noqa: E402
from tests.sources.conftest import GITHUB_SECRET, github_headers  # noqa: E402
from tests.web.admin.conftest import artifacts, browser_type_launch_args, chromium_missing  # noqa: E402,F401

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),  # the live server's thread must see committed rows
    pytest.mark.skipif(chromium_missing(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]
URL = "/admin/sources/source/"
BODY = b'{"zen": "Keep it logically awesome."}'


def github(base: str, source_id: str, *, delivery: str, secret: str = GITHUB_SECRET, signed: bool = True):
    headers = github_headers(BODY, secret, delivery=delivery) if signed else {"X-GitHub-Delivery": delivery}
    return requests.post(f"{base}/in/{source_id}", data=BODY, headers={**headers, "Content-Type": "application/json"},
                         timeout=10)


def stored(source: Source) -> int:
    return Message.objects.filter(channel_id=source.channel_id).count()


def open_until(page, url: str, text: str, seconds: float = 10.0) -> str:
    """Open ``url`` again until its page shows ``text`` (a process's tally is written once a second)."""
    def shows() -> bool:
        page.goto(url)
        return text in page.content()
    wait_for(shows, seconds, interval=0.3)
    return page.content()


def run_action(page, base: str, source: Source, action: str) -> None:
    page.goto(f"{base}{URL}")
    page.check(f"input.action-select[value='{source.pk}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.wait_for_load_state()


def test_operator_creates_reads_counts_rotates_and_disables_a_source(page, live_server, admin_user, world, artifacts):
    page.set_default_timeout(15_000)
    page.set_viewport_size({"width": 1400, "height": 900})
    base = live_server.url
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")

    # create: the secret is shown once, beside the address to give the provider
    page.goto(f"{base}{URL}add/")
    page.select_option("#id_channel", str(Channel.objects.get(channel_id="ch1").pk))
    page.fill("#id_name", "gh")
    page.select_option("#id_verify", "github")
    page.fill("#id_new_secret", GITHUB_SECRET)
    page.click("input[name=_save]")
    page.wait_for_load_state()
    source = Source.objects.get(name="gh")
    shown = page.locator("body").inner_text()
    assert source.verify == "github" and source.enabled and source.secret == GITHUB_SECRET
    assert f"/in/{source.source_id}" in shown and GITHUB_SECRET in shown
    page.screenshot(path=str(artifacts / "source-created.png"), full_page=True)

    # the provider's requests: accepted, a redelivery, one without a signature
    assert github(base, source.source_id, delivery="d-1").status_code == 200
    assert github(base, source.source_id, delivery="d-1").status_code == 200
    refused = github(base, source.source_id, delivery="d-2", signed=False)
    assert refused.status_code == 401 and refused.json()["error"] == "signature_missing"
    assert stored(source) == 1

    # the change page: the counts by outcome and the last refusal, never the secret
    change = f"{base}{URL}{source.pk}/change/"
    content = open_until(page, change, "refused: signature_missing")
    counts = page.locator(".field-counts_table").inner_text()
    assert "accepted\t1" in counts and "duplicate\t1" in counts and "refused: signature_missing\t1" in counts, counts
    assert "signature_missing" in page.locator(".field-refusals_table").inner_text()
    assert GITHUB_SECRET not in content and GITHUB_SECRET not in page.locator("body").inner_text()
    page.screenshot(path=str(artifacts / "source-counts.png"), full_page=True)

    # rotate with the list's action: the new secret is shown once, the old one verifies for the grace
    run_action(page, base, source, "rotate_secret")
    source.refresh_from_db()
    assert source.secret != GITHUB_SECRET and source.previous_secret == GITHUB_SECRET
    assert source.secret in page.locator("body").inner_text()
    assert github(base, source.source_id, delivery="d-3").status_code == 200
    assert github(base, source.source_id, delivery="d-4", secret=source.secret).status_code == 200
    assert stored(source) == 3

    # disable with the list's action: every request refused, nothing stored
    run_action(page, base, source, "disable")
    source.refresh_from_db()
    assert not source.enabled
    disabled = github(base, source.source_id, delivery="d-5", secret=source.secret)
    assert disabled.status_code == 403 and disabled.json()["error"] == "source_disabled"
    assert stored(source) == 3
    page.screenshot(path=str(artifacts / "source-disabled.png"), full_page=True)
