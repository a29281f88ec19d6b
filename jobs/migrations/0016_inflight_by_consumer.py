"""``job_inflight_consumer``: one consumer's in-flight jobs by deadline.

Serves the lazy timeout sweep of a pull consumer (``expire_inflight`` with a consumer, in jobs/sweeps/queries.sql) and the
waiting pulls' "next deadline" probe (``consumers.pull._NEXT_SQL``). ``job_inflight_deadline``
(all consumers by deadline) made those step over every other consumer's expired jobs: with
100,000 expired jobs elsewhere, each lazy sweep of a pull read all of them. Partial (in-flight
rows only), built CONCURRENTLY so a large live table keeps taking writes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("jobs", "0015_partition_completed_at"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_inflight_consumer ON jobs_job (consumer_id, deadline) "
            "WHERE status = 1002",
            "DROP INDEX CONCURRENTLY IF EXISTS job_inflight_consumer",
        ),
    ]
