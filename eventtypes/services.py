"""Create, change and delete a channel's event types (the PUT, the admin, the seed and the import
call these). A change of schema is a new version; every version is kept while the type exists.

Each write locks the event type's row (``select_for_update``) in its transaction, so two changes
of one type are made one after the other and versions are numbered without gaps or repeats; the
triggers of migration 0001 move the generation on in the same transaction, which every process's
validators follow (``eventtypes.validation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from django.db import IntegrityError, transaction

from broker.errors import Conflict, NotFound, PreconditionFailed
from broker.models import Channel
from broker.registry import Precondition, db_now, row_update
from eventtypes.models import EventType, EventTypeVersion
from eventtypes.rules import canonical, event_type_name_parse, example_check, payload_fault, schema_compile
from eventtypes.validation import rules_changed

UNSET = object()  # a field the request left out: unchanged
EVENT_TYPES_MAX = 1000  # per channel: the catalog, the documents and each process's cache stay bounded


@dataclass
class EventTypeChange:
    """What a request sets; ``UNSET`` / None: unchanged. ``schema`` None: no schema (any payload);
    ``example`` None: no example."""

    schema: object = UNSET
    description: str | None = None
    example: object = UNSET
    deprecated: bool | None = None


@dataclass
class Upserted:
    event_type: EventType
    action: str  # created, updated or unchanged
    dropped_example: bool = False  # the schema changed and the kept example no longer validated


def event_type_upsert(*, channel: Channel, name: str, change: EventTypeChange,
                      unmodified_since: int | None = None) -> Upserted:
    """Create the event type, or change it. ``unmodified_since`` (epoch seconds: If-Unmodified-Since)
    is optional; when given, a type changed since is refused (412). 400 ``invalid_example`` for an
    example the schema refuses; a new schema that the kept example no longer fits drops the example."""
    name = event_type_name_parse(name)
    validator = schema_compile(change.schema) if isinstance(change.schema, dict) else None
    with transaction.atomic():
        event_type = EventType.objects.select_for_update().filter(channel=channel, name=name).first()
        if event_type is None:
            created = _create(channel, name, change, validator)
            if created is not None:
                rules_changed()
                return Upserted(created, "created")
            event_type = EventType.objects.select_for_update().get(channel=channel, name=name)  # lost a race
        return _update(event_type, change, validator, unmodified_since)


def _create(channel: Channel, name: str, change: EventTypeChange, validator) -> EventType | None:
    """A new event type at version 1 (None: another request created it meanwhile)."""
    if EventType.objects.filter(channel=channel).count() >= EVENT_TYPES_MAX:
        raise Conflict("too_many_event_types", f"a channel has at most {EVENT_TYPES_MAX} event types")
    schema = None if change.schema is UNSET else change.schema
    example = None if change.example is UNSET else change.example
    if example is not None and validator is not None:
        example_check(example, validator, version=1)
    try:
        with transaction.atomic():
            event_type = EventType.objects.create(
                channel=channel, name=name, description=change.description or "", example=example,
                deprecated=bool(change.deprecated), version=1, updated_at=db_now())
            EventTypeVersion.objects.create(event_type=event_type, version=1, schema=schema)
    except IntegrityError:
        return None
    return event_type


def _update(event_type: EventType, change: EventTypeChange, validator, unmodified_since: int | None) -> Upserted:
    if unmodified_since is not None and int(event_type.updated_at.timestamp()) != unmodified_since:
        raise PreconditionFailed("precondition_failed", "the event type was modified since If-Unmodified-Since")
    current = EventTypeVersion.objects.filter(event_type=event_type, version=event_type.version).first()
    current_schema = current.schema if current is not None else None
    new_version = change.schema is not UNSET and canonical(change.schema) != canonical(current_schema)
    schema = change.schema if new_version else current_schema
    if validator is None and schema is not None:
        validator = schema_compile(schema)
    values: dict = {}
    version = event_type.version + 1 if new_version else event_type.version
    dropped = False
    if change.example is not UNSET:
        if change.example is not None and validator is not None:
            example_check(change.example, validator, version=version)
        if canonical(change.example) != canonical(event_type.example):
            values["example"] = change.example
    elif new_version and event_type.example is not None and validator is not None \
            and payload_fault(validator, event_type.example) is not None:
        values["example"], dropped = None, True
    if change.description is not None and change.description != event_type.description:
        values["description"] = change.description
    if change.deprecated is not None and change.deprecated != event_type.deprecated:
        values["deprecated"] = change.deprecated
    if new_version:
        values["version"] = version
        EventTypeVersion.objects.create(event_type=event_type, version=version, schema=schema)
    if not values:
        return Upserted(event_type, "unchanged")
    row_update(model=EventType, pk=event_type.pk, values=values)
    rules_changed()
    return Upserted(EventType.objects.get(pk=event_type.pk), "updated", dropped_example=dropped)


def event_type_delete(*, channel: Channel, name: str, unmodified_since: int | None = None) -> None:
    """Delete an event type with all its versions: 404 ``event_type_not_found``; with
    ``unmodified_since``, 412 when it changed since."""
    with transaction.atomic():
        event_type = EventType.objects.select_for_update().filter(channel=channel, name=name).first()
        if event_type is None:
            raise NotFound("event_type_not_found", "event type not found")
        if unmodified_since is not None and int(event_type.updated_at.timestamp()) != unmodified_since:
            raise PreconditionFailed("precondition_failed", "the event type was modified since If-Unmodified-Since")
        event_type.delete()
        rules_changed()


def event_type_get(*, channel: Channel, name: str) -> EventType:
    """One event type with its versions (``versions_all``, oldest first); 404 ``event_type_not_found``."""
    event_type = EventType.objects.filter(channel=channel, name=name).prefetch_related("versions").first()
    if event_type is None:
        raise NotFound("event_type_not_found", "event type not found")
    return event_type


def event_types_list(*, channel_pks) -> list[EventType]:
    """The event types of the channels, by channel then name, with their versions prefetched."""
    return list(EventType.objects.filter(channel_id__in=list(channel_pks)).select_related("channel")
                .prefetch_related("versions").order_by("channel__channel_id", "name"))


def versions_all(event_type: EventType) -> list[EventTypeVersion]:
    """Every version of the type, oldest first (from the prefetch when there is one)."""
    return sorted(event_type.versions.all(), key=lambda v: v.version)


def schema_current(event_type: EventType):
    """The schema of the type's current version (None: no schema)."""
    return next((v.schema for v in event_type.versions.all() if v.version == event_type.version), None)


def unmodified_since_epoch(raw: str | None) -> int | None:
    """If-Unmodified-Since as epoch seconds (absent or empty: None, the write is not conditional);
    400 ``invalid_precondition`` when it is not an HTTP date (``broker.registry.Precondition``)."""
    if raw is None or raw.strip() == "":
        return None
    return Precondition(raw).epoch()
