"""Indexes for the operator's admin.

``job_dead`` serves the admin's most used view, "dead jobs" (of every consumer, or of a channel),
ordered by id: without it that page walks the primary key over every delivered job until it has
found a page of dead ones. Partial, so it holds only dead jobs and costs one entry per job that
dies.

``jobtransition_at_brin`` and ``deliveryattempt_started_brin`` serve the history lists filtered
by time ("state changes in the last hour"): both tables are append-only, so rows lie on disk in
time order and a BRIN index (a few pages, next to nothing to maintain) narrows a scan to the
recent end of the table. Measured on 9M transitions: "dead in the last hour" 1.5 s without it.

All built CONCURRENTLY so large live tables keep taking writes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("jobs", "0003_push_dispatch"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_dead ON jobs_job (id) WHERE status = 1004",
            "DROP INDEX CONCURRENTLY IF EXISTS job_dead",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobtransition_at_brin ON jobs_jobtransition USING brin (at)",
            "DROP INDEX CONCURRENTLY IF EXISTS jobtransition_at_brin",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveryattempt_started_brin "
            "ON jobs_deliveryattempt USING brin (started_at)",
            "DROP INDEX CONCURRENTLY IF EXISTS deliveryattempt_started_brin",
        ),
    ]
