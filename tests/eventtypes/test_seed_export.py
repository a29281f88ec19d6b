"""Event types in the seed file and in ``manage.py broker_export`` (issue 37 part 1): the export
writes each channel's eventTypes and event types, a seed of it gives them back (export, empty the
registry, seed, export again: equal), and a seeded type is enforced at publish; bad sections are
skipped with an error, as the consumers' are."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from broker.models import Channel, Producer
from consumers.seed import seed_apply, seed_parse
from eventtypes.models import EventType
from tests.helpers import seed_one_channel

pytestmark = pytest.mark.django_db
ORDER = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}


def _export(*args) -> str:
    out = io.StringIO()
    call_command("broker_export", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_export_seed_export_round_trip(make, api, tmp_path):
    make.basics()
    api.put("/channel/ch1", {"eventTypes": "closed"}, HTTP_IF_UNMODIFIED_SINCE=api.get("/channel/ch1")["Last-Modified"])
    api.put("/channel/ch1/event-type/order.created", {"schema": ORDER, "example": {"id": 1},
                                                      "description": "Line one.\n\n# not a comment\nLine four."},
            format="json")
    api.put("/channel/ch1/event-type/legacy/v1:ping", {"deprecated": True, "description": "  padded"}, format="json")
    first = _export("--with-secrets")
    assert "[initial-channel-event-types]\nch1=closed" in first
    assert "[event-type:ch1/order.created]" in first and "[event-type:ch1/legacy/v1:ping]" in first
    path = tmp_path / "registry.ini"
    path.write_text(first)

    EventType.objects.all().delete()
    Channel.objects.all().delete()
    Producer.objects.all().delete()
    out = io.StringIO()
    call_command("seed", config=str(path), stdout=out, stderr=io.StringIO())
    assert "2 event types (new: 2)" in out.getvalue()
    assert _export("--with-secrets") == first
    order = api.get("/channel/ch1/event-type/order.created").json()
    assert order["Schema"] == ORDER and order["Description"] == "Line one.\n\n# not a comment\nLine four."
    assert api.get("/channel/ch1/event-type/legacy/v1:ping").json()["Description"] == "  padded"
    # the seeded rules hold at publish
    assert make.publish(body=b'{"id": "x"}', HTTP_X_BROKER_MESSAGE_TYPE="order.created").status_code == 422
    assert make.publish(body=b'{"id": 1}', HTTP_X_BROKER_MESSAGE_TYPE="unknown").json()["error"] == "unknown_event_type"
    # seeding again changes nothing (no new version)
    call_command("seed", config=str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert api.get("/channel/ch1/event-type/order.created").json()["Version"] == 1


def test_bad_event_type_sections_are_skipped_with_an_error():
    plan = seed_parse(seed_one_channel(f"""
[initial-channel-event-types]
ch=ajar
other=closed
[event-type:ch/good]
schema={json.dumps(ORDER)}
example={{"id": 1}}
[event-type:ch/bad.schema]
schema={{"type": "nonsense"}}
[event-type:ch/bad.example]
schema={json.dumps(ORDER)}
example={{"id": "one"}}
[event-type:nope/x]
description=no such channel
[event-type:ch/has space]
description=x
"""))
    assert list(plan.event_types) == [("ch", "good")]
    errors = "\n".join(plan.errors)
    for text in ("eventTypes must be open or closed", "channel other: eventTypes for a channel not in",
                 "bad.schema: schema is not a valid JSON Schema", "bad.example: example does not validate",
                 "channel 'nope' is not a seeded channel", "has space"):
        assert text in errors, (text, errors)
    assert seed_apply(plan)["event_types"] == 1
    assert EventType.objects.get().name == "good"
