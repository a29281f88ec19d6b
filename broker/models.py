"""Core data: channels, producers and the messages they publish."""

from __future__ import annotations

from django.db import models


class Registered(models.Model):
    """What a channel and a producer both have: a display name, a secret token and the times of
    creation and of the last change (``updated_at`` is the optimistic-concurrency version of updates)."""

    name = models.CharField(max_length=255)
    token = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()
    key_field = ""  # the unique id the API names the row by (channel_id, producer_id)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return getattr(self, self.key_field)


class Channel(Registered):
    """A named stream of messages; every consumer of the channel gets one job per message."""

    channel_id = models.CharField(max_length=255, unique=True)
    key_field = "channel_id"
    # Expiry: seconds a message without its own X-Broker-Message-TTL stays deliverable (null: forever).
    message_ttl = models.PositiveIntegerField(null=True, blank=True)
    # Retention: seconds a message stays stored once all its jobs are finished (null: BROKER_RETENTION);
    # removed by the retention sweep (jobs.sweeps.retention) with its jobs, history and attempts.
    retention = models.PositiveIntegerField(null=True, blank=True)
    # Event types (issue 37, eventtypes/): "open" lets a message whose type has no event type through,
    # "closed" refuses it (422 unknown_event_type). A change reaches every process's validators
    # within a second (a trigger bumps eventtypes_generation; eventtypes.validation).
    event_types = models.CharField(max_length=8, default="open", db_default="open",
                                   choices=[("open", "open"), ("closed", "closed")])

    class Meta:
        indexes = [models.Index(fields=["-created_at", "-id"], name="channel_list")]


class Producer(Registered):
    producer_id = models.CharField(max_length=255, unique=True)
    key_field = "producer_id"
    # Flow control: a token bucket in the row (null rate: no limit). ``rate_tokens``/``rate_at`` are
    # the bucket's state, updated atomically by each publish (``publishing.producer_rate_take``).
    rate_limit_per_second = models.FloatField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    rate_tokens = models.FloatField(null=True, blank=True)
    rate_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-created_at", "-id"], name="producer_list")]


class MessageContent(models.Model):
    """What a producer sent: shared by a published message and one scheduled for later."""

    message_id = models.CharField(max_length=255)
    payload = models.BinaryField()
    content_type = models.CharField(max_length=255, default="application/octet-stream")
    priority = models.IntegerField(default=0)
    headers = models.JSONField(default=dict, blank=True)
    # Trace context (W3C, issue 25): the producer's traceparent / tracestate, or a new trace started
    # at publish; every delivery carries the trace id (jobs.push.delivery, jobs.pull.shapes).
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    tracestate = models.CharField(max_length=512, blank=True, default="", db_default="")

    class Meta:
        abstract = True


class Message(MessageContent):
    """A published message. Its payload is stored as bytes, exactly as received."""

    class Status(models.IntegerChoices):
        ACKNOWLEDGED = 101
        DISPATCHED = 102

    # No FK constraints (migration 0010): a constraint is a check per stored message at commit
    # (with the two of jobs_job: 0.02 ms of the publish statement's PostgreSQL CPU per message).
    # Channels and producers are never deleted (neither the API nor the admin offers it).
    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="messages", db_constraint=False)
    producer = models.ForeignKey(Producer, on_delete=models.PROTECT, related_name="messages", db_constraint=False)
    status = models.PositiveSmallIntegerField(choices=Status.choices, default=Status.DISPATCHED)
    received_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Filters: the message's type (X-Broker-Message-Type), matched against consumers' messageTypes at
    # fan-out. Expiry: after ``expires_at`` none of its jobs is delivered (copied onto each job).
    type = models.CharField(max_length=128, null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "message_id"], name="message_unique_per_channel"),
        ]
        indexes = [
            models.Index(fields=["channel", "-id"], name="message_by_channel"),
            models.Index(fields=["received_at"], name="message_received"),
            # Replay (jobs.publish.replay): a channel's messages in a time window, walked in chunks.
            models.Index(fields=["channel", "received_at", "id"], name="message_channel_received"),
        ]

    def __str__(self) -> str:
        return self.message_id


class ScheduledMessage(MessageContent):
    """A message to publish later (``X-Broker-Scheduled-For``). When due, the scheduler sweep
    (jobs.publish.scheduled) publishes it as a normal message with the same id, in the transaction that
    marks it DISPATCHED; until then it can be deleted. FAILED: the id was taken meanwhile."""

    class Status(models.IntegerChoices):
        SCHEDULED = 101
        DISPATCHED = 102
        FAILED = 103

    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="scheduled_messages")
    producer = models.ForeignKey(Producer, on_delete=models.PROTECT, related_name="+")
    status = models.PositiveSmallIntegerField(choices=Status.choices, default=Status.SCHEDULED)
    dispatch_at = models.DateTimeField()
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    error = models.CharField(max_length=255, blank=True, default="")
    type = models.CharField(max_length=128, null=True, blank=True)  # published with the message
    ttl = models.PositiveIntegerField(null=True, blank=True)  # seconds, counted from publication

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "message_id"], name="scheduled_unique_per_channel"),
        ]
        indexes = [
            models.Index(fields=["channel", "-id"], name="scheduled_by_channel"),
            # The scheduler sweep and "next scheduled" only look at pending rows, by due time.
            models.Index(fields=["dispatch_at"], name="scheduled_due",
                         condition=models.Q(status=101)),
            models.Index(fields=["channel", "dispatch_at"], name="scheduled_next_by_channel",
                         condition=models.Q(status=101)),
        ]

    def __str__(self) -> str:
        return self.message_id


class Counter(models.Model):
    """Maintained counts (jobs per consumer and status, messages per channel and status).

    Statement-level triggers append signed deltas to ``CounterDelta`` (append-only, so concurrent
    writers never contend on a counter row); ``counters_compact`` folds them in here. Readers sum
    both, so a count is exact at any moment without ``COUNT(*)`` over the big tables.
    """

    class Scope(models.IntegerChoices):
        JOB = 1  # owner = consumer pk
        MESSAGE = 2  # owner = channel pk

    scope = models.PositiveSmallIntegerField(choices=Scope.choices)
    owner_id = models.BigIntegerField()
    status = models.PositiveSmallIntegerField()
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "owner_id", "status"], name="counter_key"),
        ]


class CounterDelta(models.Model):
    """Pending deltas of the counters. The table is written and read by SQL only (the triggers, the
    named queries): partitioned by ``slot`` (two time slots, each emptied by TRUNCATE once folded)
    and indexed on (scope, owner_id, status) by jobs migration 0023, which the model's state leaves
    to it. Still managed: Django's flush (the tests' isolation) empties it with the other tables."""

    scope = models.PositiveSmallIntegerField()
    owner_id = models.BigIntegerField()
    status = models.PositiveSmallIntegerField()
    delta = models.BigIntegerField()


class SeedState(models.Model):
    """Singleton row recording the last applied seed configuration (for /_status)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    data_hash = models.CharField(max_length=64, blank=True, default="")
    data = models.JSONField(default=dict)
    applied_at = models.DateTimeField(null=True)
