"""Portal links (what an operator hands to the team behind a consumer), the sessions opened with
them, the counts that rate-limit opening them (and test events), and the replays started in the
portal (run as django-q2 tasks, one at a time per consumer).

Tokens are never stored: a link keeps the SHA-256 of its token, a session the SHA-256 of its
cookie's value (``web.portal.rules.token_hash``), so a copy of the database opens nothing. The
consumer is a plain reference (no database constraint): a consumer is deleted by one raw
statement (``consumers.services.consumer_delete``) that must not fail on its links; a link whose
consumer is gone opens nothing.
"""

from __future__ import annotations

from django.db import models

from consumers.models import Consumer


class Scope(models.TextChoices):
    MANAGE = "manage"  # sees everything, changes the endpoint, requeues, replays
    READ = "read"  # sees everything, changes nothing (no forms)


class PortalLink(models.Model):
    consumer = models.ForeignKey(Consumer, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
                                 related_name="+")  # portallink_consumer leads with it
    token_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.MANAGE)
    created_by = models.CharField(max_length=160, help_text="who made it: the admin token or a staff user")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=160, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["consumer", "-id"], name="portallink_consumer")]

    def __str__(self) -> str:
        return f"portal link {self.pk}"


class PortalSession(models.Model):
    """A browser's visit opened with a link: its cookie names this row (hashed); it ends when
    the link expires or either is revoked."""

    link = models.ForeignKey(PortalLink, on_delete=models.CASCADE, related_name="sessions")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"portal session {self.pk}"


class PortalOpenCount(models.Model):
    """Counts per key and minute, for the portal's rate limits: link openings per client address
    (the address is the key), test events per consumer (``test-event:<consumer pk>``); rows older
    than a few minutes are deleted as new minutes start."""

    address = models.CharField(max_length=64)
    minute = models.BigIntegerField()  # unix time // 60
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["address", "minute"], name="portalopen_address_minute")]


class ReplayState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class PortalReplay(models.Model):
    """A replay asked for in the portal, run by a django-q2 task (``web.portal.replays``) in turns
    that fit the task timeout, its cursor kept here between turns. At most one per consumer is
    queued or running (a partial unique index: the database refuses a second)."""

    consumer = models.ForeignKey(Consumer, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
                                 related_name="+")  # (a few rows per consumer: read whole)
    link = models.ForeignKey(PortalLink, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    since = models.DateTimeField()
    until = models.DateTimeField()  # the window's end, fixed when asked (now when left empty)
    only_failed = models.BooleanField(default=False)
    state = models.CharField(max_length=8, choices=ReplayState.choices, default=ReplayState.QUEUED)
    after_at = models.DateTimeField(null=True, blank=True)  # where the next turn goes on (the replay's keyset)
    after_id = models.BigIntegerField(default=0)
    replayed = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()  # each turn writes it: a queued or running row left alone is stale

    class Meta:
        constraints = [models.UniqueConstraint(fields=["consumer"], condition=models.Q(state__in=["queued", "running"]),
                                               name="portalreplay_active")]

    def __str__(self) -> str:
        return f"portal replay {self.pk}"
