"""Consumers: push (HTTP callback) or pull (fetch over HTTP), with their delivery settings."""

from __future__ import annotations

from django.db import models

from broker.models import Channel


class Consumer(models.Model):
    class Type(models.TextChoices):
        PUSH = "push"
        PULL = "pull"

    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="consumers")
    consumer_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    token = models.CharField(max_length=255)
    callback_url = models.CharField(max_length=2048, blank=True, default="")
    type = models.CharField(max_length=8, choices=Type.choices, default=Type.PUSH)

    # Push delivery (null = broker default from settings).
    max_in_flight = models.PositiveIntegerField(default=10)
    max_deliveries_per_second = models.FloatField(null=True, blank=True)
    connection_timeout = models.FloatField(null=True, blank=True)
    max_retry = models.PositiveIntegerField(null=True, blank=True)
    retry_backoff = models.CharField(max_length=255, blank=True, default="")
    signing_secret = models.CharField(max_length=128, blank=True, default="")
    previous_signing_secret = models.CharField(max_length=128, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "consumer_id"], name="consumer_unique_per_channel"),
        ]
        indexes = [models.Index(fields=["channel", "-created_at", "-id"], name="consumer_list")]

    def __str__(self) -> str:
        return f"{self.channel.channel_id}/{self.consumer_id}"

    @property
    def is_pull(self) -> bool:
        return self.type == self.Type.PULL


class PullWaiter(models.Model):
    """A pull request that is waiting for jobs right now (a long-poll), visible to every process.

    One row per waiting pull, inserted when it starts to wait and deleted when it returns; a
    waiter that dies leaves a row that simply expires (``expires_at``). ``NumWaiting`` counts the
    live rows of a consumer. The group fields (group, priority, pin id, thresholds) are what a
    per-consumer arbiter needs to decide, under a lock, which waiter gets the next job
    (priority groups: overflow, pinned client, prioritized).
    """

    # No database constraint: these rows are ephemeral, and a consumer deletion (raw SQL) must
    # never fail on a waiter that is just arriving; its row expires on its own.
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="waiters", db_constraint=False)
    group = models.CharField(max_length=64, blank=True, default="")
    priority = models.IntegerField(default=0)
    pin_id = models.CharField(max_length=64, blank=True, default="")
    min_pending = models.PositiveIntegerField(null=True, blank=True)
    min_ack_pending = models.PositiveIntegerField(null=True, blank=True)
    batch = models.PositiveIntegerField(default=1)
    max_bytes = models.BigIntegerField(null=True, blank=True)
    arrived_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["consumer", "expires_at"], name="pullwaiter_live")]

    def __str__(self) -> str:
        return f"waiter {self.pk} of consumer {self.consumer_id}"
