"""A channel's event types and their schema versions, and the generation every change bumps."""

from __future__ import annotations

from django.db import models

from broker.models import Channel


class EventType(models.Model):
    """A message type of a channel (``X-Broker-Message-Type``) with what its messages hold: the
    current ``version`` of its schema (``EventTypeVersion``), a description, an example that
    validates, and whether producers should stop sending it. ``updated_at`` is its Last-Modified."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=128)  # broker.message_types rules
    description = models.TextField(blank=True, default="")
    example = models.JSONField(null=True, blank=True)  # validates against the current version's schema
    deprecated = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=1)  # the current EventTypeVersion
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "name"], name="eventtype_unique_per_channel")]
        verbose_name = "event type"

    def __str__(self) -> str:
        return self.name


class EventTypeVersion(models.Model):
    """One schema of an event type, never changed once written (a change of schema is a new
    version). ``schema`` null: the type has no schema (any payload)."""

    event_type = models.ForeignKey(EventType, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    schema = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["event_type", "version"], name="eventtypeversion_unique")]

    def __str__(self) -> str:
        return f"{self.event_type_id} v{self.version}"


class Generation(models.Model):
    """One row: a number every change of an event type, a version or a channel's ``event_types``
    moves on (triggers, migration 0001), whoever writes. Each process reads it at most twice a
    second and reloads what it cached before it moved (``eventtypes.validation``)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    value = models.BigIntegerField(default=0)
