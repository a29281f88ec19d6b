"""``manage.py replay CHANNEL CONSUMER --since T [--until T] [--only-failed]``: replay a window of
the channel's messages to one consumer."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.errors import DomainError
from broker.times import rfc3339_parse
from consumers.models import Consumer
from jobs.publish.replay import consumer_replay


class Command(BaseCommand):
    help = ("Give the consumer a fresh QUEUED job for every message of its channel received in [--since, "
            "--until] (RFC 3339; --until defaults to now) and still stored, as POST "
            "/channel/{cid}/consumer/{conid}/replay does: delivered and dead jobs go back to QUEUED, messages "
            "without a job of this consumer get one; --only-failed replays dead jobs only. Jobs queued or in "
            "flight now, and partitioned jobs, are skipped. Works in chunks of 10,000 messages; an advisory "
            "(replay) is recorded.")

    def add_arguments(self, parser):
        parser.add_argument("channel", help="channel id")
        parser.add_argument("consumer", help="consumer id")
        parser.add_argument("--since", required=True, help="start of the window, RFC 3339 (e.g. 2030-01-02T03:04:05Z)")
        parser.add_argument("--until", help="end of the window, RFC 3339 (default: now)")
        parser.add_argument("--only-failed", action="store_true", help="replay only DEAD jobs")

    def handle(self, *args, channel, consumer, since, until=None, only_failed=False, **options):
        found = Consumer.objects.select_related("channel").filter(
            channel__channel_id=channel, consumer_id=consumer).first()
        if found is None:
            raise CommandError(f"consumer {channel}/{consumer} not found")
        try:
            result = consumer_replay(consumer=found, since=rfc3339_parse(since, field="since"),
                                     until=rfc3339_parse(until, field="until") if until else None,
                                     only_failed=only_failed, source="command")
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"replayed {result.replayed} message(s) to {channel}/{consumer}, "
                          f"skipped {result.skipped}, in {result.seconds:.2f} s")
