"""Sources in the admin: create and edit through the service (the secret shown once, never again),
disable, rotate, delete; the address, the counts by outcome and the last refusals; the channel
page lists its sources; a source's message shows where it came from."""

from __future__ import annotations

import pytest

from broker.models import Channel, Message
from sources.models import Source
from tests.helpers import admin_form_data
from tests.sources.conftest import GITHUB_SECRET

pytestmark = pytest.mark.django_db

URL = "/admin/sources/source/"


def test_create_shows_the_address_and_the_secret_once(admin_client, world):
    channel = Channel.objects.get(channel_id="ch1")
    r = admin_client.post(f"{URL}add/", {"channel": channel.pk, "name": "gh", "verify": "github",
                                        "new_secret": "a-long-github-secret", "dedupe_window_text": "24h",
                                        "response_status": "200", "enabled": "on"})
    assert r.status_code == 200, r.content
    source = Source.objects.get(name="gh")
    html = r.content.decode()
    assert "a-long-github-secret" in html and f"/in/{source.source_id}" in html and "no-store" in r["Cache-Control"]
    assert source.dedupe_window == 86400 and source.verify == "github"
    page = admin_client.get(f"{URL}{source.pk}/change/").content.decode()
    assert "a-long-github-secret" not in page and f"/in/{source.source_id}" in page


def test_the_forms_refusals_are_the_apis(admin_client, world):
    channel = Channel.objects.get(channel_id="ch1")
    r = admin_client.post(f"{URL}add/", {"channel": channel.pk, "name": "mac", "verify": "hmac",
                                        "new_secret": "x", "response_status": "200"})
    assert r.status_code == 200 and not Source.objects.exists()
    assert "signatureHeader is required" in r.content.decode()
    r = admin_client.post(f"{URL}add/", {"channel": channel.pk, "name": "gh", "verify": "github",
                                        "new_secret": "x", "dedupe_window_text": "45d", "response_status": "200"})
    assert "dedupeWindow" in r.content.decode() and not Source.objects.exists()


def test_edit_counts_refusals_disable_rotate_delete(admin_client, sources):
    made = sources.make("gh")
    sources.github(made, delivery="a")
    sources.github(made, delivery="a")
    sources.post(made, b"{}", {})
    source = Source.objects.get(name="gh")
    r = admin_client.get(f"{URL}{source.pk}/change/")
    html = r.content.decode()
    assert "signature_missing" in html and "refused: signature_missing" in html
    assert GITHUB_SECRET not in html

    data = admin_form_data(r, message_type="value:github.event")
    r = admin_client.post(f"{URL}{source.pk}/change/", data, follow=True)
    assert r.status_code == 200
    source.refresh_from_db()
    assert source.message_type == "value:github.event" and source.secret == GITHUB_SECRET

    admin_client.post(URL, {"action": "disable", "_selected_action": [source.pk]})
    assert sources.github(made, delivery="b").status_code == 403
    admin_client.post(URL, {"action": "enable", "_selected_action": [source.pk]})
    assert sources.github(made, delivery="c").status_code == 200

    r = admin_client.post(URL, {"action": "rotate_secret", "_selected_action": [source.pk]})
    source.refresh_from_db()
    assert source.secret != GITHUB_SECRET and source.secret in r.content.decode()
    assert source.previous_secret == GITHUB_SECRET
    assert sources.github(made, delivery="d").status_code == 200  # the previous one, within the grace
    assert sources.github(made, delivery="e", secret=source.secret).status_code == 200

    listing = admin_client.get(URL).content.decode()
    assert "gh" in listing and source.secret not in listing
    channel_page = admin_client.get(f"/admin/broker/channel/{source.channel_id}/change/").content.decode()
    assert "inbound sources" in channel_page.lower() and f"{URL}{source.pk}/change/" in channel_page

    message = Message.objects.first()
    assert "X-Broker-Source" in admin_client.get(f"/admin/broker/message/{message.pk}/change/").content.decode()

    r = admin_client.post(f"{URL}{source.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not Source.objects.exists()
    assert sources.github(made, delivery="f").status_code == 404
