"""The portal's "Event catalog" (issue 37): the event types of the consumer's channel, each with its
description, current schema, example, earlier versions and whether it is deprecated, and whether the
consumer's ``messageTypes`` selects it (``broker.message_types.message_type_matches``, the fan-out's
rule): what the receiving team gets, and in which shape, without asking the producers."""

from __future__ import annotations

import json

from broker.message_types import message_type_matches, message_types_text
from eventtypes.services import event_types_list, schema_current, versions_all
from web.portal.access import page_render, portal_page
from web.portal.links import PortalAccess


def _pretty(value) -> str | None:
    return None if value is None else json.dumps(value, indent=2, ensure_ascii=False)


@portal_page
def event_catalog_view(request, access: PortalAccess):
    consumer = access.consumer
    patterns = consumer.message_types or []
    entries = []
    for event_type in event_types_list(channel_pks=[consumer.channel_id]):
        entries.append({
            "type": event_type, "schema": _pretty(schema_current(event_type)), "example": _pretty(event_type.example),
            "selected": message_type_matches(event_type.name, patterns),
            "older": [{"version": v.version, "schema": _pretty(v.schema), "created_at": v.created_at}
                      for v in reversed(versions_all(event_type)) if v.version != event_type.version],
        })
    return page_render(request, access, "event_catalog.html", "event_catalog", title="Event catalog", entries=entries,
                       selects=message_types_text(patterns) or "all types", closed=consumer.channel.event_types == "closed",
                       selected=sum(1 for e in entries if e["selected"]))
