"""Job indexes by state (issue 35): each index holds the jobs of the states it serves.

- ``job_consumer_status`` (consumer, status, id DESC) held every job in every state, so each job
  added an entry at publish, claim and outcome, and a walk of one consumer's QUEUED jobs by it
  stepped over every job that had left the queue while a long reader held its snapshot (the
  planner chose it for the claims' first walks when the statistics called the queue small). Now
  finished jobs only (status >= DELIVERED): the DLQ and the finished listings.
- ``job_claim`` (consumer, priority DESC, id) duplicated the claims' ``job_push_fresh`` and
  ``job_push_retry`` (migration 0003), which the pull claims now walk as the push claim does. It
  becomes (consumer, id), QUEUED only: one consumer's waiting jobs oldest first (the oldest
  waiting job, listings, purges, the doorbell's mark), which job_consumer_status served before.

Built CONCURRENTLY under new names, then the old ones dropped CONCURRENTLY and the new ones renamed
(a catalog change), so a large live table keeps taking writes.
"""

from django.db import migrations, models
from django_migration_linter import IgnoreMigration

FORWARD = [
    ("CREATE INDEX CONCURRENTLY IF NOT EXISTS job_claim_by_id ON jobs_job (consumer_id, id) WHERE status = 1001",
     "DROP INDEX CONCURRENTLY IF EXISTS job_claim_by_id"),
    ("CREATE INDEX CONCURRENTLY IF NOT EXISTS job_consumer_finished ON jobs_job (consumer_id, status, id DESC) "
     "WHERE status >= 1003",
     "DROP INDEX CONCURRENTLY IF EXISTS job_consumer_finished"),
    ("DROP INDEX CONCURRENTLY IF EXISTS job_claim",
     "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_claim ON jobs_job (consumer_id, priority DESC, id) WHERE status = 1001"),
    ("DROP INDEX CONCURRENTLY IF EXISTS job_consumer_status",
     "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_consumer_status ON jobs_job (consumer_id, status, id DESC)"),
    ("ALTER INDEX job_claim_by_id RENAME TO job_claim",
     "ALTER INDEX job_claim RENAME TO job_claim_by_id"),
    ("ALTER INDEX job_consumer_finished RENAME TO job_consumer_status",
     "ALTER INDEX job_consumer_status RENAME TO job_consumer_finished"),
]


class Migration(migrations.Migration):
    atomic = False  # CREATE / DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("jobs", "0023_counter_slots"),
    ]

    # safe: every index is built and dropped CONCURRENTLY; the renames are catalog changes that
    # only give the new indexes the old names (no statement names an index; the plan checks read
    # the names from pg_indexes), under a lock held for a moment.
    operations = [
        IgnoreMigration(),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(forward, reverse) for forward, reverse in FORWARD],
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="job_claim"),
                migrations.RemoveIndex(model_name="job", name="job_consumer_status"),
                migrations.AddIndex(model_name="job", index=models.Index(
                    fields=["consumer", "id"], name="job_claim", condition=models.Q(status=1001))),
                migrations.AddIndex(model_name="job", index=models.Index(
                    fields=["consumer", "status", "-id"], name="job_consumer_status",
                    condition=models.Q(status__gte=1003))),
            ],
        ),
    ]
