"""Consumers: push (HTTP callback) or pull (fetch over HTTP), with their delivery settings."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Value

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

    # Priority groups (pull consumers only; jobs.pull.groups). One group for now.
    priority_policy = models.CharField(max_length=16, default="none")
    priority_groups = models.JSONField(default=list, blank=True)
    priority_timeout = models.FloatField(null=True, blank=True)

    # Flow control: paused consumers get nothing (jobs keep accumulating); at most
    # ``max_ack_pending`` jobs in flight (pull and push); publishing is refused (429 backlog_full)
    # while ``max_queued`` jobs are QUEUED (null: unlimited).
    paused = models.BooleanField(default=False, db_default=False)
    max_ack_pending = models.PositiveIntegerField(default=1000, db_default=1000)
    max_queued = models.PositiveBigIntegerField(null=True, blank=True)
    # Doorbell (pull consumers with a callback URL): at most one ring per ``notify_interval`` seconds.
    notify_interval = models.FloatField(default=1.0, db_default=1.0)
    # Partitions: with ``ordered``, at most one job of a partition in flight at a time, in publish order.
    ordered = models.BooleanField(default=False, db_default=False)
    # Filters: type patterns (``order.*``, ``invoice.paid``, ``*``); null = every message. Matched by
    # the fan-out statements (insert_* in jobs/publish/queries.sql); rules in broker.message_types.
    message_types = ArrayField(models.CharField(max_length=130), null=True, blank=True)
    # Content filters (consumers.filters): the filter as given (normalized; null = every message) and
    # its plan, the flat form ``broker_filter_match`` walks in the fan-out statement without a query
    # per node; the plan is compiled from ``filter`` by a database trigger on every write (migration
    # 0011), so no writer can let them disagree.
    filter = models.JSONField(null=True, blank=True)
    filter_plan = models.JSONField(null=True, blank=True, editable=False)
    # Circuit breaker (push; jobs.push.circuit): OPEN after this many consecutive failed attempts (0: off)
    # when they have gone on for ``circuit_breaker_open_after_seconds`` without a success, then one
    # probe delivery every ``circuit_breaker_probe_seconds``.
    circuit_breaker_failures = models.PositiveIntegerField(default=10, db_default=10)
    circuit_breaker_probe_seconds = models.FloatField(default=30.0, db_default=30.0)
    circuit_breaker_open_after_seconds = models.FloatField(default=10.0, db_default=10.0)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "consumer_id"], name="consumer_unique_per_channel"),
        ]
        indexes = [models.Index(fields=["channel", "-created_at", "-id"], name="consumer_list"),
                   # filters: whether the channel has a filtered consumer (one probe per publish)
                   models.Index(fields=["channel"], name="consumer_filtered",
                                condition=models.Q(filter_plan__isnull=False))]

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
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="waiters", db_constraint=False,
                                 db_index=False)  # pullwaiter_live leads with consumer_id
    group = models.CharField(max_length=64, blank=True, default="")
    priority = models.IntegerField(default=0)
    pin_id = models.CharField(max_length=64, blank=True, default="")
    min_pending = models.PositiveIntegerField(null=True, blank=True)
    min_ack_pending = models.PositiveIntegerField(null=True, blank=True)
    batch = models.PositiveIntegerField(default=1)
    max_bytes = models.BigIntegerField(null=True, blank=True)
    # Priority-group delivery: the dispatcher (under the consumer's lock) claims jobs for a waiter
    # and appends them here; ``state`` 0 waiting, 1 served (batch full), 2 wrong pin id.
    job_ids = ArrayField(models.BigIntegerField(), default=list, blank=True,
                         db_default=Value([], ArrayField(models.BigIntegerField())))
    state = models.SmallIntegerField(default=0, db_default=0)
    turn = models.BigIntegerField(default=0, db_default=0)  # round-robin order within a priority level
    incremental_timeout = models.FloatField(null=True, blank=True)
    arrived_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["consumer", "expires_at"], name="pullwaiter_live")]

    def __str__(self) -> str:
        return f"waiter {self.pk} of consumer {self.consumer_id}"


class PriorityGroupState(models.Model):
    """Pin state of one priority group of a pull consumer, shared by every web process.

    ``pinned_client_id``/``pinned_ts`` are empty while unpinned; ``renewed_at`` is the last pull
    carrying the current pin id (or the pin time): the pin is released once ``priorityTimeout``
    passes after it. Written only under the consumer's dispatch lock (``jobs.pull.groups``).
    """

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="group_states",
                                 db_constraint=False)
    group = models.CharField(max_length=16)
    pinned_client_id = models.CharField(max_length=64, blank=True, default="")
    pinned_ts = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["consumer", "group"], name="group_state_unique")]

    def __str__(self) -> str:
        return f"group {self.group} of consumer {self.consumer_id}"


class Advisory(models.Model):
    """A recorded broker event about a consumer (pinned, unpinned, partition events, ...).

    Generic on purpose: ``type`` names the event, ``data`` holds its own fields. Identified by
    the channel and consumer ids as text (and the consumer's pk, no constraint) so the record
    outlives a deleted consumer. See ``jobs.advisories.advisory_record``.
    """

    type = models.CharField(max_length=64)
    channel_id = models.CharField(max_length=255)
    consumer_id = models.CharField(max_length=255, blank=True, default="")
    consumer_pk = models.BigIntegerField(null=True, blank=True)
    group = models.CharField(max_length=64, blank=True, default="")
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "advisories"
        indexes = [models.Index(fields=["consumer_pk", "id"], name="advisory_consumer")]

    def __str__(self) -> str:
        return f"{self.type} {self.channel_id}/{self.consumer_id} {self.group}"


class DoorbellState(models.Model):
    """Doorbell state of a pull consumer with a callback URL (``jobs.pull.doorbell``).

    ``armed``: a check saw no ready QUEUED job since the last ring (or the last ring failed).
    ``mark``: the newest QUEUED job id when it last rang; once that job has left QUEUED the
    consumer has drained what it was rung for. ``next_ring_at``: no ring before this time (last
    ring + notifyInterval). Written only by ``doorbell_ring_due`` (one conditional upsert, so two
    ringers never ring twice within an interval). Its own small table keeps these writes off the
    consumer row that every publish joins; no constraint, like ``PullWaiter``: a consumer deletion
    (raw SQL) never trips on it, and orphans are pruned by the ringer.
    """

    consumer = models.OneToOneField(Consumer, on_delete=models.CASCADE, primary_key=True,
                                    related_name="doorbell", db_constraint=False)
    armed = models.BooleanField(default=True)
    mark = models.BigIntegerField(null=True, blank=True)
    rang_at = models.DateTimeField(null=True, blank=True)
    next_ring_at = models.DateTimeField(null=True, blank=True)
    rings = models.BigIntegerField(default=0)
    failures = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"doorbell of consumer {self.consumer_id}"


class CircuitState(models.IntegerChoices):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class Circuit(models.Model):
    """Circuit breaker state of a push consumer (``jobs.push.circuit``): consecutive failed attempts,
    CLOSED / OPEN / HALF_OPEN (a probe in flight) since when, and when the next probe may go.

    A row appears with the consumer's first failed attempt; no row means CLOSED. Written by the
    push record statement (``push_record`` in jobs/push/queries.sql: one UPDATE per consumer and batch,
    row-locked, so concurrent dispatchers add up) and the push claim (OPEN -> HALF_OPEN). Its own
    small table, like ``DoorbellState``: the consumer row that every publish joins is not written.
    """

    consumer = models.OneToOneField(Consumer, on_delete=models.CASCADE, primary_key=True,
                                    related_name="circuit", db_constraint=False)
    state = models.SmallIntegerField(choices=CircuitState.choices, default=CircuitState.CLOSED)
    since = models.DateTimeField()
    failures = models.IntegerField(default=0)
    next_probe_at = models.DateTimeField(null=True, blank=True)
    # The first failure of the current run (null after a success): the circuit opens only once the
    # run has lasted ``circuitBreakerOpenAfterSeconds`` (no success since, so none for that long).
    failing_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"circuit of consumer {self.consumer_id}"
