"""Channels, producers, messages and scheduled messages in the admin."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.utils.http import http_date

from broker.models import Channel, Message, Producer, ScheduledMessage

pytestmark = pytest.mark.django_db

LONG = "channel-token-0123456789-tail"


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def later(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_channel_list_masks_tokens_and_counts_from_counters(admin_client, broker, make):
    make.channel("ch2", token=LONG)
    r = admin_client.get("/admin/broker/channel/")
    html = r.content.decode()
    assert LONG not in html and "ch-token" not in html and "\u2022\u2022\u2022\u2022tail" in html
    ch1 = next(c for c in r.context["cl"].result_list if c.channel_id == "ch1")
    assert (ch1.n_consumers, ch1.n_messages, ch1.n_scheduled) == (2, 10, 0)


def test_channel_page_lists_its_consumers(admin_client, broker):
    ch = Channel.objects.get(channel_id="ch1")
    html = admin_client.get(f"/admin/broker/channel/{ch.pk}/change/").content.decode()
    assert "c1" in html and "c2" in html and "status__exact=1004" in html
    assert 'name="new_token"' in html and "ch-token" not in html


def test_channel_token_change_through_the_service(admin_client, broker, client_anon):
    ch = Channel.objects.get(channel_id="ch1")
    data = {"name": "Renamed", "new_token": LONG, "loaded_at": int(ch.updated_at.timestamp())}
    r = admin_client.post(f"/admin/broker/channel/{ch.pk}/change/", data, follow=True)
    assert r.status_code == 200
    ch.refresh_from_db()
    assert (ch.name, ch.token) == ("Renamed", LONG)
    # the API takes the new token
    assert client_anon.get("/channel/ch1/messages", HTTP_X_BROKER_CHANNEL_TOKEN=LONG).status_code == 200
    # an empty new token keeps the current one; a stale form is refused
    r = admin_client.post(f"/admin/broker/channel/{ch.pk}/change/", data | {"new_token": "", "name": "Again"},
                          follow=True)
    assert any("changed by someone else" in m for m in messages_of(r))
    ch.refresh_from_db()
    assert (ch.name, ch.token) == ("Renamed", LONG)


def test_channel_retention_through_the_form_with_the_puts_rules(admin_client, broker, api):
    """The admin's channel form edits ``retention`` (issue 24) by the PUT's rules and shows the footprint."""
    ch = Channel.objects.get(channel_id="ch1")
    html = admin_client.get(f"/admin/broker/channel/{ch.pk}/change/").content.decode()
    assert 'name="retention_text"' in html and "(BROKER_RETENTION)" in html and "removed by retention" in html
    data = {"name": "One", "new_token": "", "retention_text": "90m", "loaded_at": int(ch.updated_at.timestamp())}
    r = admin_client.post(f"/admin/broker/channel/{ch.pk}/change/", data, follow=True)
    assert r.status_code == 200 and not r.context.get("errors")
    ch.refresh_from_db()
    assert ch.retention == 5400 and api.get("/channel/ch1").json()["Retention"] == "90m"
    html = admin_client.get(f"/admin/broker/channel/{ch.pk}/change/").content.decode()
    assert 'value="90m"' in html
    # a bad duration is a form error and changes nothing; emptying it hands the channel back to the default
    data["loaded_at"] = int(ch.updated_at.timestamp())
    r = admin_client.post(f"/admin/broker/channel/{ch.pk}/change/", data | {"retention_text": "soon"})
    assert r.status_code == 200 and "must be a duration" in r.content.decode()
    ch.refresh_from_db()
    assert ch.retention == 5400
    r = admin_client.post(f"/admin/broker/channel/{ch.pk}/change/", data | {"retention_text": ""}, follow=True)
    ch.refresh_from_db()
    assert r.status_code == 200 and ch.retention is None and api.get("/channel/ch1").json()["Retention"] is None


def test_add_channel_and_producer(admin_client, db):
    r = admin_client.post("/admin/broker/channel/add/", {"channel_id": "fresh", "name": "", "new_token": ""},
                          follow=True)
    assert r.status_code == 200
    ch = Channel.objects.get(channel_id="fresh")
    assert ch.name == "fresh" and len(ch.token) >= 16
    admin_client.post("/admin/broker/producer/add/", {"producer_id": "pp", "name": "P", "new_token": "x" * 20})
    assert Producer.objects.get(producer_id="pp").token == "x" * 20
    r = admin_client.post("/admin/broker/channel/add/", {"channel_id": "a/b", "name": "", "new_token": ""})
    assert "channel_id" in r.context["adminform"].form.errors and not Channel.objects.filter(channel_id="a/b").exists()


def test_producer_list_masks_tokens(admin_client, broker):
    html = admin_client.get("/admin/broker/producer/").content.decode()
    assert "p-token" not in html and "p1" in html


def test_channels_and_producers_cannot_be_deleted_here(admin_client, broker):
    ch = Channel.objects.get(channel_id="ch1")
    assert admin_client.get(f"/admin/broker/channel/{ch.pk}/delete/").status_code == 403


def test_message_list_and_page(admin_client, broker):
    ch = Channel.objects.get(channel_id="ch1")
    r = admin_client.get("/admin/broker/message/", {"channel": ch.pk})
    assert r.context["cl"].result_count == 10  # from the counters
    assert r.context["cl"].result_list[0].size == len(b'{"n": 9, "hello": "world"}')
    r = admin_client.get("/admin/broker/message/", {"q": "m04"})
    assert [m.message_id for m in r.context["cl"].result_list] == ["m04"]
    m = Message.objects.get(message_id="m04")
    html = admin_client.get(f"/admin/broker/message/{m.pk}/change/").content.decode()
    assert "&quot;hello&quot;: &quot;world&quot;" in html
    assert "status-dead" in html and "status-queued" in html  # its jobs: c1's is dead, c2's queued
    assert admin_client.post(f"/admin/broker/message/{m.pk}/change/", {}).status_code == 403  # read-only


def test_scheduled_messages_cancel(admin_client, world, settings):
    settings.BROKER_MIN_SCHEDULE_DELAY = 1.0
    for mid in ("s1", "s2", "s3"):
        r = world.publish(body=b'{"later": true}', HTTP_X_BROKER_MESSAGE_ID=mid,
                          HTTP_X_BROKER_SCHEDULED_FOR=later(3600))
        assert r.status_code == 201, r.content
    s1, s2, s3 = (ScheduledMessage.objects.get(message_id=m) for m in ("s1", "s2", "s3"))
    ScheduledMessage.objects.filter(pk=s3.pk).update(status=ScheduledMessage.Status.DISPATCHED)  # test setup
    r = admin_client.get("/admin/broker/scheduledmessage/")
    assert r.context["cl"].result_count == 3
    html = admin_client.get(f"/admin/broker/scheduledmessage/{s1.pk}/change/").content.decode()
    assert 'id="scheduled-cancel"' in html and "&quot;later&quot;: true" in html
    r = admin_client.post("/admin/broker/scheduledmessage/",
                          {"action": "cancel", "_selected_action": [s1.pk, s3.pk]}, follow=True)
    assert any(m.startswith("Cancelled 1 scheduled message. Not cancelled (1): s3: the scheduled message was "
                            "already dispatched") for m in messages_of(r))
    assert not ScheduledMessage.objects.filter(pk=s1.pk).exists()
    r = admin_client.post(f"/admin/broker/scheduledmessage/{s2.pk}/cancel/")
    assert r.status_code == 302 and not ScheduledMessage.objects.filter(pk=s2.pk).exists()
    assert ScheduledMessage.objects.filter(pk=s3.pk).exists()


def test_admin_pages_have_a_dashboard_link(admin_client, broker):
    html = admin_client.get("/admin/broker/channel/").content.decode()
    assert '<a href="/admin/">Dashboard</a>' in html


def test_precondition_helper_matches_the_api_format(broker):
    from web.admin.helpers import precondition_for

    ch = Channel.objects.get(channel_id="ch1")
    assert precondition_for(ch.updated_at).raw == http_date(int(ch.updated_at.timestamp()))
