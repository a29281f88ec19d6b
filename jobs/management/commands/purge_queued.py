"""``manage.py purge_queued``: drop QUEUED jobs (a runaway backlog) from a shell, in batches.

The same state-machine function as ``DELETE .../queued-jobs`` and the admin action
(``jobs.state.jobs_purge_queued``): batches of ``--batch`` rows per statement (SKIP LOCKED), each
purged job recorded in the history (reason ``purged``), one progress line per batch.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.errors import DomainError
from consumers.models import Consumer
from jobs.pull import older_than_parse
from jobs.state import jobs_purge_queued


class Command(BaseCommand):
    help = (
        "Purge QUEUED jobs of consumers (in-flight, delivered and dead jobs stay), as DELETE "
        ".../queued-jobs and the admin action do. Select the consumers with --channel [--consumer] or --all; "
        "--older-than (RFC 3339 time or seconds) keeps newer jobs. Works in batches and prints progress."
    )

    def add_arguments(self, parser):
        parser.add_argument("--channel", help="channel id (all its consumers unless --consumer is given)")
        parser.add_argument("--consumer", help="consumer id within --channel")
        parser.add_argument("--all", action="store_true", help="every consumer of every channel")
        parser.add_argument("--older-than", dest="older_than", metavar="TIME_OR_SECONDS",
                            help="only jobs created before this RFC 3339 time, or more than this many seconds ago")
        parser.add_argument("--batch", type=int, default=5000, help="jobs per statement (default 5000)")

    def handle(self, *args, channel=None, consumer=None, all=False, older_than=None, batch=5000, **options):
        if batch < 1:
            raise CommandError("--batch must be at least 1")
        if all == bool(channel):
            raise CommandError("give --channel (optionally with --consumer) or --all")
        if consumer and not channel:
            raise CommandError("--consumer needs --channel")
        try:
            age = older_than_parse(older_than)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        consumers = Consumer.objects.select_related("channel").order_by("channel__channel_id", "consumer_id")
        if channel:
            consumers = consumers.filter(channel__channel_id=channel)
            if consumer:
                consumers = consumers.filter(consumer_id=consumer)
        consumers = list(consumers)
        if not consumers:
            raise CommandError("no such consumer")
        grand = 0
        for c in consumers:
            name = f"{c.channel.channel_id}/{c.consumer_id}"

            def progress(n, total, name=name):
                self.stdout.write(f"{name}: batch of {n:,} purged, {total:,} so far")

            total = jobs_purge_queued(consumer_pk=c.pk, batch=batch, progress=progress, **age)
            grand += total
            self.stdout.write(f"{name}: {total:,} queued jobs purged")
        self.stdout.write(self.style.SUCCESS(f"purged {grand:,} queued jobs in total"))
