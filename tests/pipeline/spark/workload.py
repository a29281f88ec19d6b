"""A generated broker workload written straight to the tables (ORM bulk inserts): channels,
producers, consumers, messages, jobs with their transitions and delivery attempts.

Every secret (tokens, signing secrets, credentials in callback URLs and headers) contains
``SECRET_MARK`` so tests can scan exported data for leaks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job, JobTransition

SECRET_MARK = "S3CRET"
QUEUED, INFLIGHT, DELIVERED, DEAD = 1001, 1002, 1003, 1004
FAILURES = [
    (500, ""), (502, ""), (503, ""), (404, ""),
    (None, "connection refused"), (None, "ReadTimeout: read timed out\nTraceback (most recent call last): ..."),
    (500, "server said no"),
]


@dataclass
class World:
    channels: list = field(default_factory=list)
    producers: list = field(default_factory=list)
    consumers: list = field(default_factory=list)  # (consumer, channel)
    messages: list = field(default_factory=list)


def world_create(*, channels: int = 2, consumers_per_channel: int = 2, tag: str = "w") -> World:
    now = datetime.now(timezone.utc)
    world = World()
    producer = Producer.objects.create(producer_id=f"{tag}-producer", name="P", token=f"{SECRET_MARK}-p-{tag}",
                                       updated_at=now)
    world.producers.append(producer)
    for c in range(channels):
        channel = Channel.objects.create(channel_id=f"{tag}-ch{c}", name=f"Channel {c}",
                                         token=f"{SECRET_MARK}-ch-{tag}-{c}", updated_at=now)
        world.channels.append(channel)
        for k in range(consumers_per_channel):
            consumer = Consumer.objects.create(
                channel=channel, consumer_id=f"{tag}-c{c}{k}", name=f"Consumer {c}{k}",
                token=f"{SECRET_MARK}-co-{tag}-{c}{k}", type="pull" if k == 1 else "push",
                callback_url=f"https://user:{SECRET_MARK}pw@example.test/cb?key={SECRET_MARK}q" if k == 0 else "",
                signing_secret=f"whsec_{SECRET_MARK}{c}{k}", previous_signing_secret=f"whsec_old_{SECRET_MARK}",
                updated_at=now)
            world.consumers.append((consumer, channel))
    return world


class Builder:
    """Accumulates rows and writes them with a few bulk inserts."""

    def __init__(self, world: World, seed: int = 7):
        self.world = world
        self.rng = random.Random(seed)
        self.n = 0
        self.delivered_without_transition = 0

    def message(self, *, channel: Channel, received_at: datetime, fates: dict | None = None,
                dead_at: datetime | None = None, status: int = 102) -> Message:
        """One message on ``channel`` with a job per consumer of the channel; ``fates`` maps a
        consumer id to delivered/dead/queued/inflight (random when not given)."""
        self.n += 1
        message = Message.objects.create(
            channel=channel, producer=self.world.producers[0], message_id=f"m-{self.n}",
            payload=f'{{"n": {self.n}}}'.encode(), content_type="application/json", priority=self.n % 3,
            headers={"X-Trace": f"t{self.n}", "Authorization": f"Bearer {SECRET_MARK}-hdr",
                     "X-Api-Key": f"{SECRET_MARK}-key"},
            status=status, received_at=received_at, dispatched_at=received_at)
        self.world.messages.append(message)
        if status != 102:
            return message
        fates = fates or {}
        jobs, history = [], []
        for consumer, ch in self.world.consumers:
            if ch.pk != channel.pk:
                continue
            fate = fates.get(consumer.consumer_id) or self.rng.choices(
                ["delivered", "dead", "queued", "inflight"], [70, 10, 10, 10])[0]
            job, rows = self._job(message, consumer, fate, received_at, dead_at)
            jobs.append(job)
            history.append(rows)
        Job.objects.bulk_create(jobs)
        transitions, attempts = [], []
        for job, (trans, atts) in zip(jobs, history):
            transitions += [JobTransition(job_id=job.pk, **t) for t in trans]
            attempts += [DeliveryAttempt(job_id=job.pk, **a) for a in atts]
        JobTransition.objects.bulk_create(transitions)
        DeliveryAttempt.objects.bulk_create(attempts)
        return message

    def _job(self, message, consumer, fate, received_at, dead_at):
        rng = self.rng
        pull = consumer.type == "pull"
        t = received_at + timedelta(milliseconds=rng.uniform(5, 500))
        trans, atts = [], []
        retry = 0
        failures = {"delivered": rng.choice([0, 0, 0, 1, 2, 3]), "dead": 3, "queued": rng.choice([0, 1]),
                    "inflight": rng.choice([0, 1])}[fate]
        for i in range(failures):
            trans.append(dict(from_status=QUEUED, to_status=INFLIGHT, retry_count=retry, reason="claim", at=t))
            code, error = rng.choice(FAILURES)
            duration = rng.uniform(10, 3000)
            atts.append(dict(attempt=i + 1, started_at=t, duration_ms=duration, status_code=code, error=error,
                             outcome="failed", response_excerpt="oops" if code else ""))
            t += timedelta(milliseconds=duration)
            last = fate == "dead" and i == failures - 1
            if last and dead_at is not None:
                t = dead_at
            trans.append(dict(from_status=INFLIGHT, to_status=DEAD if last else QUEUED,
                              retry_count=retry if last else retry + 1, reason="failed", at=t))
            if not last:
                retry += 1
                t += timedelta(seconds=rng.choice([5, 30, 60]))
        status = {"delivered": DELIVERED, "dead": DEAD, "queued": QUEUED, "inflight": INFLIGHT}[fate]
        if fate in ("delivered", "inflight"):
            trans.append(dict(from_status=QUEUED, to_status=INFLIGHT, retry_count=retry, reason="claim", at=t))
        if fate == "delivered":
            duration = rng.lognormvariate(4, 1)
            atts.append(dict(attempt=failures + 1, started_at=t, duration_ms=duration,
                             status_code=None if pull else rng.choice([200, 204]), error="",
                             outcome="delivered"))
            t += timedelta(milliseconds=duration)
            if self.delivered_without_transition == 0 and not pull:
                self.delivered_without_transition += 1  # history lacks it: status_changed_at is used
            else:
                trans.append(dict(from_status=INFLIGHT, to_status=DELIVERED, retry_count=retry, reason="ack", at=t))
        job = Job(message=message, consumer=consumer, channel_id=message.channel_id, status=status,
                  priority=message.priority, retry_count=retry, next_attempt_at=t, status_changed_at=t,
                  created_at=received_at)
        return job, (trans, atts)


def workload_report(*, now: datetime, messages_per_channel: int = 40, in_scope_hours: float = 60,
                    out_of_scope: int = 5, tag: str = "r") -> World:
    """Messages spread over the last ``in_scope_hours`` plus a few older ones (out of scope)."""
    world = world_create(tag=tag)
    builder = Builder(world)
    for channel in world.channels:
        for _ in range(messages_per_channel):
            builder.message(channel=channel, received_at=now - timedelta(hours=builder.rng.uniform(1, in_scope_hours)))
        for _ in range(out_of_scope):
            builder.message(channel=channel, received_at=now - timedelta(days=builder.rng.uniform(20, 30)))
    return world


def history(*, tag: str, days: float, per_channel: int, now: datetime) -> tuple[Builder, list]:
    """``per_channel`` messages on each of two channels (two consumers each), spread over the last
    ``days``; the builder (to add more) and the channels."""
    world = world_create(tag=tag)
    builder = Builder(world, seed=5)
    for channel in world.channels:
        for _ in range(per_channel):
            builder.message(channel=channel, received_at=now - timedelta(days=builder.rng.uniform(0.01, days)))
    return builder, world.channels


FIGURES = ("jobs", "summary", "attempts_histogram", "failures", "throughput", "partitions")  # report.json


def assert_same_figures(got: dict, want: dict) -> None:
    """Two reports equal figure for figure (floats included: the report's sums are exact)."""
    for name in FIGURES:
        assert got[name] == want[name], name
