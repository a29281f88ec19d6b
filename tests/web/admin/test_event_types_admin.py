"""Event types in the admin (issue 37): added and edited through the service with the schema shown
formatted (a new schema is a new version, every version on the page), the PUT's refusals as form
errors, a stale page refused, delete; the channel page sets eventTypes and lists its event types."""

from __future__ import annotations

import json

import pytest

from broker.models import Channel
from eventtypes.models import EventType

pytestmark = pytest.mark.django_db
ORDER = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}


def test_add_edit_and_delete_an_event_type(admin_client, make, api):
    make.basics()
    channel = Channel.objects.get(channel_id="ch1")
    r = admin_client.post("/admin/eventtypes/eventtype/add/", {
        "channel": channel.pk, "name": "order.created", "description": "Placed.", "schema_text": json.dumps(ORDER),
        "example_text": '{"id": 1}'}, follow=True)
    assert r.status_code == 200 and not r.context.get("errors"), r.content.decode()[:2000]
    event_type = EventType.objects.get()
    assert (event_type.name, event_type.version, event_type.example) == ("order.created", 1, {"id": 1})

    page = admin_client.get(f"/admin/eventtypes/eventtype/{event_type.pk}/change/").content.decode()
    assert "&quot;required&quot;: [\n    &quot;id&quot;\n  ]" in page  # the schema formatted, two spaces
    loaded = int(event_type.updated_at.timestamp())
    form = {"description": "Placed.", "schema_text": json.dumps({**ORDER, "required": []}), "example_text": '{"id": 1}',
            "loaded_at": loaded}
    r = admin_client.post(f"/admin/eventtypes/eventtype/{event_type.pk}/change/", form, follow=True)
    assert not r.context.get("errors")
    assert api.get("/channel/ch1/event-type/order.created").json()["Version"] == 2
    page = admin_client.get(f"/admin/eventtypes/eventtype/{event_type.pk}/change/").content.decode()
    assert "versions" in page and "<strong>2</strong>" in page

    # the PUT's refusals are form errors; a page loaded before a change is refused
    r = admin_client.post(f"/admin/eventtypes/eventtype/{event_type.pk}/change/",
                          {**form, "schema_text": '{"type": "nope"}', "loaded_at": loaded + 5})
    assert r.status_code == 200 and "not a valid JSON Schema" in r.content.decode()
    r = admin_client.post(f"/admin/eventtypes/eventtype/{event_type.pk}/change/", {**form, "description": "x"},
                          follow=True)
    assert "changed by someone else" in r.content.decode()

    r = admin_client.post(f"/admin/eventtypes/eventtype/{event_type.pk}/delete/", {"post": "yes"}, follow=True)
    assert r.status_code == 200 and not EventType.objects.exists()


def test_the_channel_page_sets_event_types_and_lists_them(admin_client, make, api):
    make.basics()
    api.put("/channel/ch1/event-type/order.created", {"schema": ORDER}, format="json")
    channel = Channel.objects.get(channel_id="ch1")
    page = admin_client.get(f"/admin/broker/channel/{channel.pk}/change/").content.decode()
    assert 'name="event_types_mode"' in page and "order.created" in page
    r = admin_client.post(f"/admin/broker/channel/{channel.pk}/change/", {
        "name": "ch1", "new_token": "", "retention_text": "", "event_types_mode": "closed",
        "loaded_at": int(channel.updated_at.timestamp())}, follow=True)
    assert r.status_code == 200 and not r.context.get("errors")
    assert api.get("/channel/ch1").json()["EventTypes"] == "closed"
    assert make.publish(HTTP_X_BROKER_MESSAGE_TYPE="other").json()["error"] == "unknown_event_type"
