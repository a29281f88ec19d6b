"""``manage.py requeue_dead``: dead jobs back to QUEUED from a shell, in batches with progress.

The same state-machine function as the DLQ endpoint and the admin action
(``jobs.ops.dead_jobs.jobs_requeue_dead``), called per batch of ids found through the consumer/status
index, so millions of dead jobs never hold one long lock and the operator sees it advance.
"""

from __future__ import annotations

import argparse
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from broker.counters import JOB, counts_for
from broker.xid import job_pk
from jobs.management.selection import consumer_arguments, consumers_select
from jobs.ops.dead_jobs import jobs_requeue_dead
from jobs.ops.queries import Q
from jobs.state.transitions import DEAD


def job_id_arg(text: str) -> int:
    """A job ID (the xid the API and the admin show) as its primary key; anything else is a usage error."""
    pk = job_pk(text)
    if pk is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job ID (20 characters of 0-9 a-v)")
    return pk


class Command(BaseCommand):
    help = (
        "Requeue dead jobs (DEAD -> QUEUED, retry count reset to 0) through the job state machine, as "
        "POST .../dlq and the admin do. Select the consumers with --channel [--consumer] or --all; "
        "--job limits it to given job IDs. Works in batches and prints progress."
    )

    def add_arguments(self, parser):
        consumer_arguments(parser)
        parser.add_argument("--job", type=job_id_arg, action="append", dest="jobs", metavar="ID",
                            help="only this job (its job ID as the API and the admin show it; repeatable)")
        parser.add_argument("--dry-run", action="store_true", help="only show how many dead jobs there are")

    def handle(self, *args, channel=None, consumer=None, all=False, jobs=None, batch=5000, dry_run=False,
               **options):
        consumers = consumers_select(channel=channel, consumer=consumer, all=all, batch=batch)
        if not consumers:
            raise CommandError("no such consumer" if consumer else "no consumers found")

        dead = counts_for(scope=JOB, owner_ids=[c.pk for c in consumers])
        started = time.monotonic()
        total = 0
        for c in consumers:
            name = f"{c.channel.channel_id}/{c.consumer_id}"
            expected = dead.get(c.pk, {}).get(DEAD, 0) if not jobs else len(jobs)
            if dry_run:
                self.stdout.write(f"{name}: {dead.get(c.pk, {}).get(DEAD, 0):,} dead jobs")
                continue
            done = 0
            for ids in _dead_id_batches(consumer_pk=c.pk, batch=batch, only=jobs):
                done += jobs_requeue_dead(consumer_pk=c.pk, job_ids=ids, reason="cli-requeue")
                if options.get("verbosity", 1) >= 1:
                    self.stdout.write(f"{name}: {done:,} / {max(expected, done):,} requeued "
                                      f"({time.monotonic() - started:.1f} s)")
            total += done
        if not dry_run:
            self.stdout.write(self.style.SUCCESS(
                f"Requeued {total:,} dead job{'s' if total != 1 else ''} of {len(consumers)} "
                f"consumer{'s' if len(consumers) != 1 else ''} in {time.monotonic() - started:.1f} s."))


def _dead_id_batches(*, consumer_pk: int, batch: int, only: list[int] | None):
    """Ids of the consumer's dead jobs in ascending batches (index ``job_consumer_status``)."""
    last = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(Q.dead_id_batch.sql, [consumer_pk, DEAD, last, only, only, batch])
            ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return
        yield ids
        last = ids[-1]
        if len(ids) < batch:
            return
