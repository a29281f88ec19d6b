"""Portal links (what an operator hands to the team behind a consumer), the sessions opened with
them, and the counts that rate-limit opening them.

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
    """Link openings per client address and minute (the rate limit; rows older than a few minutes
    are deleted as new minutes start)."""

    address = models.CharField(max_length=64)
    minute = models.BigIntegerField()  # unix time // 60
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["address", "minute"], name="portalopen_address_minute")]
