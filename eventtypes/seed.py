"""Event types in the seed file and the export (``consumers.seed`` and ``consumers.export`` call
these, so ``manage.py broker_export`` then ``manage.py seed`` gives the same event types)::

    [initial-channel-event-types]        channelId=open|closed   (the channel's eventTypes)
    [event-type:<channelId>/<type>]      description=  (text; with line breaks: a JSON string)
                                         schema=       (JSON Schema 2020-12, JSON on one line; empty: none)
                                         example=      (JSON on one line; empty: none)
                                         deprecated=   (true|false)

A key left out leaves the value as it is; the schema written is the current version's (a seed
makes a new version when it differs: the versions' history is the database's, not the file's).
A section for a channel that is not seeded, a type that is not a message type, a schema that is not
valid or an example it refuses is skipped with an error, as the consumers' sections are.
"""

from __future__ import annotations

import json
import logging

from broker.errors import DomainError
from broker.models import Channel
from eventtypes.rules import (deprecated_parse, description_parse, event_type_name_parse, example_check, example_parse,
                              mode_parse, schema_compile, schema_parse)
from eventtypes.services import UNSET, EventTypeChange, event_type_upsert, event_types_list, schema_current
from eventtypes.validation import rules_changed

logger = logging.getLogger("broker.services.seed")
MODES_SECTION = "initial-channel-event-types"
PREFIX = "event-type:"


def event_types_seed_parse(ini, channels: dict, errors: list) -> dict:
    """The event types of a parsed INI (``configparser``): {(channel id, type): fields}; each
    channel's mode is set into ``channels`` (the seed's channel values, ``event_types``)."""
    if ini.has_section(MODES_SECTION):
        for cid, raw in ini.items(MODES_SECTION):
            if cid not in channels:
                errors.append(f"channel {cid}: eventTypes for a channel not in [initial-channels], ignored")
                continue
            try:
                mode = mode_parse(raw)
            except DomainError as exc:
                errors.append(f"channel {cid}: {exc.detail}, ignored")
                continue
            if mode is not None:
                channels[cid]["event_types"] = mode
    found = {}
    for section in ini.sections():
        if not section.startswith(PREFIX):
            continue
        cid, _, name = section[len(PREFIX):].partition("/")
        if cid not in channels:
            errors.append(f"event type {section}: channel {cid!r} is not a seeded channel, skipped")
            continue
        try:
            found[(cid, event_type_name_parse(name))] = _fields(dict(ini.items(section)))
        except DomainError as exc:
            errors.append(f"event type {section}: {exc.detail}, skipped")
    return found


def _fields(options: dict) -> dict:
    fields: dict = {}
    if "description" in options:
        text = options["description"].strip()
        if text.startswith('"'):
            try:
                text = json.loads(text)
            except ValueError:
                pass
        fields["description"] = description_parse(text)
    if "schema" in options:
        fields["schema"] = schema_parse(options["schema"], text=True)
    if "example" in options:
        fields["example"] = example_parse(options["example"], text=True)
        if fields["example"] is not None and fields.get("schema") is not None:
            example_check(fields["example"], schema_compile(fields["schema"]))
    if options.get("deprecated", "").strip():
        fields["deprecated"] = deprecated_parse(options["deprecated"])
    return fields


def event_types_seed_apply(channels: dict[str, Channel], types: dict) -> int:
    """Create or change each event type of the plan (in the seed's transaction); a refusal (an
    example the seeded schema refuses, too many types) is logged and the rest goes on. Returns how
    many were created."""
    created = 0
    rules_changed()  # the channels' eventTypes too, applied by the seed before this
    for (cid, name), fields in types.items():
        change = EventTypeChange(schema=fields.get("schema", UNSET), description=fields.get("description"),
                                 example=fields.get("example", UNSET), deprecated=fields.get("deprecated"))
        try:
            created += event_type_upsert(channel=channels[cid], name=name, change=change).action == "created"
        except DomainError as exc:
            logger.error("seed: event type %s/%s skipped: %s", cid, name, exc.detail)
    return created


def event_types_export(channels: list[Channel]) -> tuple[list[tuple[str, str]], list[tuple[str, list]]]:
    """The seed sections of the channels' event types: ([initial-channel-event-types] items,
    [(section name, items)])."""
    modes = [(c.channel_id, c.event_types) for c in channels if c.event_types != "open"]
    sections = []
    for event_type in event_types_list(channel_pks=[c.pk for c in channels]):
        items = [("description", _description(event_type.description))]
        schema = schema_current(event_type)
        items.append(("schema", "" if schema is None else json.dumps(schema, separators=(",", ":"))))
        items.append(("example", "" if event_type.example is None else json.dumps(event_type.example,
                                                                                  separators=(",", ":"))))
        items.append(("deprecated", str(event_type.deprecated).lower()))
        sections.append((f"{PREFIX}{event_type.channel.channel_id}/{event_type.name}", items))
    return modes, sections


def _description(text: str) -> str:
    """Text on one line as it is; text with line breaks (or that would read as JSON) as a JSON string."""
    if "\n" in text or "\r" in text or text.startswith('"') or text != text.strip():
        return json.dumps(text)
    return text

