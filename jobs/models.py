"""Jobs (one per message and consumer), their append-only history, and maintained counters.

A job's status changes only through the status writers, each beside the protocol code that calls
it (claims and acks in jobs.pull, the push claim and record in jobs.push, the sweeps, the
operator's actions in jobs.ops; docs/architecture.md lists them) and each checked against the one
transition table (``jobs/state/transitions.py``); the database trigger of migration 0017 refuses
any other move and writes the history. Admin forms show the status read-only.
"""

from __future__ import annotations

from django.db import models

from broker.models import Channel, Message
from broker.xid import job_xid
from consumers.models import Consumer


class JobStatus(models.IntegerChoices):
    # The integers are webhook-broker's, so exports and analytics line up with it.
    QUEUED = 1001
    INFLIGHT = 1002
    DELIVERED = 1003
    DEAD = 1004


class Job(models.Model):
    # No single-column indexes on these two: (message, consumer) is unique and (consumer, status, id)
    # is indexed, so they would only slow every status UPDATE (measured: record UPDATE 33% faster).
    # No FK constraints either (migration 0027; docs/architecture.md, "Integrity without foreign
    # keys"): a check per job at commit costs the fan-out's size on every publish. What they guarded,
    # the statements do: a job is inserted with its message (the same statement) or under a lock on
    # it (replay), and with a FOR KEY SHARE lock on its consumer, which consumer_delete waits for.
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="jobs", db_index=False,
                                db_constraint=False)
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="jobs", db_index=False,
                                 db_constraint=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    status = models.PositiveSmallIntegerField(choices=JobStatus.choices, default=JobStatus.QUEUED)
    priority = models.IntegerField(default=0)
    retry_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    deadline = models.DateTimeField(null=True, blank=True)
    incremental_timeout = models.FloatField(default=0)
    status_changed_at = models.DateTimeField()
    created_at = models.DateTimeField()
    # Partitions (jobs.partitions): the job's partition and gate; only jobs at their partition's
    # current gate are claimable. No FK constraint: a plain bigint costs nothing on the hot insert.
    # ``payload`` overrides the message's payload for this job only (a handler-driven gate move
    # with new data; other consumers keep theirs); NULL for nearly every job.
    partition = models.ForeignKey("Partition", on_delete=models.DO_NOTHING, null=True, blank=True,
                                  related_name="+", db_constraint=False, db_index=False)
    gate = models.IntegerField(default=0, db_default=0)
    payload = models.BinaryField(null=True, blank=True)
    # The reason of the last status change, set by the UPDATE that makes it and copied into the
    # history row by the history trigger (migration 0017, jobs.state.transitions); NULL until the first.
    last_reason = models.CharField(max_length=32, null=True, blank=True)
    # Expiry: the message's expires_at, copied at fan-out so claims test it on the job row.
    expires_at = models.DateTimeField(null=True, blank=True)
    # The current claim's receipt: every claim (pull, grouped pull, the spec's INFLIGHT, push) takes
    # a new value of the sequence jobs_job_receipt_seq (migration 0021), so it never repeats for a
    # job (a replay resets the retry count, not this). An ack or progress carrying another receipt
    # is a late one from an earlier holder: it changes nothing (jobs.pull.ack). NULL until claimed.
    receipt = models.BigIntegerField(null=True, blank=True)
    # The push dispatcher holding the current push claim (a PushOwner id; jobs.push.owners), so the
    # claims of a dispatcher that is gone go back to QUEUED at once (jobs.sweeps.orphans) instead of
    # holding their consumer's maxInFlight room until their deadline. NULL: a pull claim, or a push
    # claim made before this column (the previous release's) or without a LISTEN connection.
    claimed_by = models.BigIntegerField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "consumer"], name="job_unique_per_consumer"),
        ]
        indexes = [
            # One consumer's QUEUED jobs, oldest first (listings, the oldest waiting, purges). Claims
            # walk job_push_fresh (priority, id) and job_push_retry (next attempt) instead (migration
            # 0003: raw SQL, not here).
            models.Index(fields=["consumer", "id"], name="job_claim", condition=models.Q(status=JobStatus.QUEUED)),
            # Timeout sweep: only in-flight rows, by deadline.
            models.Index(fields=["deadline"], name="job_inflight_deadline",
                         condition=models.Q(status=JobStatus.INFLIGHT)),
            # Per-consumer listings of finished jobs (DELIVERED, DEAD: DLQ pages, admin filters). Only
            # those: a QUEUED or in-flight job would add an entry at every move (two more per job), and
            # a walk of QUEUED jobs by (consumer, status) would step over every job that left the
            # queue while a long reader holds a snapshot (issue 35; migration 0024).
            models.Index(fields=["consumer", "status", "-id"], name="job_consumer_status",
                         condition=models.Q(status__gte=JobStatus.DELIVERED)),
            # Partition settle / counts / ordered claims: per-gate status counts of one partition.
            models.Index(fields=["partition", "gate", "status"], name="job_partition_gate",
                         condition=models.Q(partition__isnull=False)),
            # Expiry sweep (jobs.sweeps.message_expiry): QUEUED jobs with an expiry, by expiry.
            models.Index(fields=["expires_at"], name="job_queued_expiry",
                         condition=models.Q(status=JobStatus.QUEUED, expires_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"job {job_xid(self.pk)}" if self.pk else "job"


class PushOwner(models.Model):
    """A push dispatcher's engine while it lives: its LISTEN connection's backend (``pid`` and
    ``backend_start``: a reused pid is another backend). When that backend is gone from
    ``pg_stat_activity`` the process is gone (killed, stopped any way, its host lost), and its push
    claims are orphans (jobs.sweeps.orphans)."""

    id = models.BigIntegerField(primary_key=True)  # random (jobs.push.owners): no sequence to share
    pid = models.IntegerField()
    backend_start = models.DateTimeField(null=True)
    registered_at = models.DateTimeField(db_default=models.functions.Now())
    # the engine's last report of the push deliveries' lag (jobs.push.lag), read by publishing's admission
    lag = models.FloatField(null=True)
    lag_at = models.DateTimeField(null=True)


class JobTransition(models.Model):
    """Append-only record of every status change (never updated)."""

    job_id = models.BigIntegerField(db_index=True)
    from_status = models.PositiveSmallIntegerField(null=True)
    to_status = models.PositiveSmallIntegerField()
    retry_count = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=32, default="")
    at = models.DateTimeField()


class DeliveryAttempt(models.Model):
    """One push attempt (or pull outcome): what the receiver answered and how long it took."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True)
    status_code = models.IntegerField(null=True)
    response_excerpt = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    outcome = models.CharField(max_length=16, default="")


class PartitionStatus(models.IntegerChoices):
    AVAILABLE = 1
    FAILED = 2
    COMPLETE = 3


class Partition(models.Model):
    """A consumer's partition (``X-Broker-Partition-Key``): jobs move through its gates in order.

    Every write is ``UPDATE ... WHERE id = %s AND version = %s`` (optimistic concurrency, see
    jobs/partitions.py); ``owner``/``lease_until`` is a push worker's lease (database time)."""

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="partitions", db_index=False)
    key = models.CharField(max_length=255)
    gate = models.IntegerField(default=0, db_default=0)
    status = models.PositiveSmallIntegerField(choices=PartitionStatus.choices, default=PartitionStatus.AVAILABLE,
                                              db_default=PartitionStatus.AVAILABLE)
    owner = models.CharField(max_length=64, blank=True, default="", db_default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    version = models.BigIntegerField(default=0, db_default=0)
    closed = models.BooleanField(default=False, db_default=False)
    auto_close = models.BooleanField(default=False, db_default=False)
    manual_checkpoint = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(db_default=models.functions.Now())
    updated_at = models.DateTimeField(db_default=models.functions.Now())
    completed_at = models.DateTimeField(null=True, blank=True)  # when it last became COMPLETE (pipeline report)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["consumer", "key"], name="partition_unique_key"),
        ]
        indexes = [
            models.Index(fields=["consumer", "status", "id"], name="partition_consumer_status"),
            models.Index(fields=["owner"], name="partition_owner", condition=~models.Q(owner="")),
        ]

    def __str__(self) -> str:
        return f"partition {self.key}"


class PlanCheck(models.Model):
    """The latest plan check of one hot statement (``jobs.ops.plans``: ``manage.py broker_plans``
    and the housekeeping watch after each ANALYZE of the big tables)."""

    statement = models.CharField(max_length=80)  # the case: "app:name" or its shape's id
    mode = models.CharField(max_length=24)  # force_generic_plan / force_custom_plan
    indexes = models.TextField(blank=True, default="")  # every index the plan uses
    cost = models.FloatField()  # the planner's estimated total cost
    problems = models.TextField(blank=True, default="")  # empty: the plan is as written
    checked_at = models.DateTimeField()
    analyzed_at = models.DateTimeField(null=True)  # the ANALYZE of jobs_job / broker_message it followed

    class Meta:
        constraints = [models.UniqueConstraint(fields=["statement", "mode"], name="plancheck_statement_mode")]

    def __str__(self) -> str:
        return f"{self.statement} ({self.mode})"


class RetentionCursor(models.Model):
    """Where the retention sweep (``jobs.sweeps.retention``) stands in one channel's messages, in
    the order of ``message_channel_received`` (received_at, id). ``tip``: every message up to it was
    examined once (new messages past the window are taken from there, so a pass never walks what
    it already removed); ``sweep``: the position of the slower pass that re-examines the messages
    kept back (a job not finished yet, a DEAD job not old enough), from the start up to the tip
    (NULL: no pass under way; the next one starts ``SWEEP_EVERY`` after ``sweep_started_at``)."""

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, primary_key=True, related_name="+",
                                   db_constraint=False)
    tip_at = models.DateTimeField(null=True)
    tip_id = models.BigIntegerField(default=0)
    sweep_at = models.DateTimeField(null=True)
    sweep_id = models.BigIntegerField(null=True)
    sweep_started_at = models.DateTimeField(null=True)


class RetentionRun(models.Model):
    """The last run of the retention sweep (one row, id 1): when, how long, what it removed. The
    totals are maintained counters (``broker.counters`` RETENTION, RETENTION_CONSUMER, RETENTION_RUNS)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    started_at = models.DateTimeField()
    seconds = models.FloatField()  # its duration
    removed = models.BigIntegerField(default=0)  # rows of the four tables it removed
    batches = models.PositiveIntegerField(default=0)
