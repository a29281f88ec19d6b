"""The portal's Event catalog (issue 37 part 3) in headless Chromium (Debian's package, driven by
Playwright; the admin e2e tests' launch settings) against the live server: a receiving team opens
its link and sees its channel's event types with their descriptions, schemas, examples, earlier
versions and deprecation, and which of them its consumer's messageTypes selects."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402 (after the skip)

from tests.web.admin.conftest import chromium_missing
from tests.web.portal.conftest import link_make, link_path

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),  # the live server's threads see committed rows
    pytest.mark.skipif(chromium_missing(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]
ORDER = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}


def test_a_team_reads_its_channels_event_catalog(page, live_server, make, api, artifacts):
    page.set_default_timeout(15_000)
    make.basics().consumer("c1", messageTypes="order.*")
    api.put("/channel/ch1/event-type/order.created", {"schema": ORDER, "description": "An order was placed.",
                                                      "example": {"id": 7}}, format="json")
    api.put("/channel/ch1/event-type/order.created", {"schema": {**ORDER, "required": ["id", "total"]},
                                                      "example": {"id": 7, "total": 3}}, format="json")
    api.put("/channel/ch1/event-type/user.signup", {"description": "Someone signed up.", "deprecated": True},
            format="json")

    page.goto(live_server.url + link_path(link_make(api)))
    page.get_by_role("button", name="Open the portal").click()
    page.get_by_role("navigation", name="Portal pages").get_by_role("link", name="Event catalog", exact=True).click()
    expect(page.locator("h1")).to_have_text("Event catalog")
    assert page.locator("#message-types").inner_text() == "order.*"
    assert page.locator("#selected-count").inner_text() == "1"

    order = page.get_by_role("region", name="order.created")
    expect(order).to_contain_text("An order was placed.")
    expect(order).to_contain_text("selected by this consumer")
    assert '"total"' in order.locator("pre.schema").inner_text()  # the current version, formatted
    assert '"total": 3' in order.locator("pre.example").inner_text()
    assert order.locator(".version").inner_text().startswith("2 ")
    order.get_by_text("Earlier versions (1)").click()
    expect(order.locator("details.versions")).to_contain_text("Version 1")

    signup = page.get_by_role("region", name="user.signup")
    expect(signup).to_contain_text("not selected")
    expect(signup).to_contain_text("deprecated")
    expect(signup).to_contain_text("none: any payload")
    page.screenshot(path=str(artifacts / "portal-event-catalog.png"), full_page=True)

    # another team's page of the same channel: everything selected (no messageTypes)
    make.consumer("c3", token="c3-token")
    page.goto(live_server.url + link_path(link_make(api, "/channel/ch1/consumer/c3")))
    page.get_by_role("button", name="Open the portal").click()
    page.goto(live_server.url + "/portal/channel/ch1/consumer/c3/event-catalog")
    assert page.locator("#message-types").inner_text() == "all types"
    assert page.locator("#selected-count").inner_text() == "2"
