"""``manage.py purge_queued``: drop QUEUED jobs (a runaway backlog) from a shell, in batches.

The same state-machine function as ``DELETE .../queued-jobs`` and the admin action
(``jobs.ops.dead_jobs.jobs_purge_queued``): batches of ``--batch`` rows per statement (SKIP LOCKED), each
purged job recorded in the history (reason ``purged``), one progress line per batch.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.errors import DomainError
from jobs.management.selection import consumer_arguments, consumers_select
from jobs.ops.dead_jobs import jobs_purge_queued
from jobs.pull.purge import older_than_parse


class Command(BaseCommand):
    help = (
        "Purge QUEUED jobs of consumers (in-flight, delivered and dead jobs stay), as DELETE "
        ".../queued-jobs and the admin action do. Select the consumers with --channel [--consumer] or --all; "
        "--older-than (RFC 3339 time or seconds) keeps newer jobs. Works in batches and prints progress."
    )

    def add_arguments(self, parser):
        consumer_arguments(parser)
        parser.add_argument("--older-than", dest="older_than", metavar="TIME_OR_SECONDS",
                            help="only jobs created before this RFC 3339 time, or more than this many seconds ago")

    def handle(self, *args, channel=None, consumer=None, all=False, older_than=None, batch=5000, **options):
        consumers = consumers_select(channel=channel, consumer=consumer, all=all, batch=batch)
        try:
            age = older_than_parse(older_than)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
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
