"""Indexes and state for the push claim (jobs.push.claim.jobs_claim_push).

- ``job_push_fresh``: due first attempts of one consumer in priority order. Separate from
  ``job_claim`` so a consumer with thousands of jobs waiting out a retry backoff (an outage)
  never makes the claim step over them: only rows with retry_count = 0 are indexed.
- ``job_push_retry``: queued retries of one consumer by next-attempt time, so "which retries are
  due" is a short range scan that stops at the first one still in backoff.
Both are partial, so a job costs an entry only while it is in the matching state. They are
raw SQL (not in ``Job.Meta``) and built CONCURRENTLY so a large live table keeps taking writes.

- ``jobs_pushpace``: one row per rate-limited consumer holding the GCRA "theoretical arrival
  time" of its next delivery (maxDeliveriesPerSecond). Written only inside the serialized push
  claim. UNLOGGED: losing it in a crash merely resets the pacing. No foreign key (a TRUNCATE of
  the consumers would need CASCADE); a deleted consumer's row is never read again.
"""

from django.db import migrations

STEPS = [  # (forward, reverse)
    ("CREATE INDEX CONCURRENTLY IF NOT EXISTS job_push_fresh ON jobs_job (consumer_id, priority DESC, id) "
     "WHERE status = 1001 AND retry_count = 0",
     "DROP INDEX CONCURRENTLY IF EXISTS job_push_fresh"),
    ("CREATE INDEX CONCURRENTLY IF NOT EXISTS job_push_retry ON jobs_job (consumer_id, next_attempt_at) "
     "WHERE status = 1001 AND retry_count > 0",
     "DROP INDEX CONCURRENTLY IF EXISTS job_push_retry"),
    ("""
     CREATE UNLOGGED TABLE IF NOT EXISTS jobs_pushpace (
         consumer_id bigint PRIMARY KEY,
         tat timestamptz NOT NULL
     )
     """,
     "DROP TABLE IF EXISTS jobs_pushpace"),
]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("consumers", "0001_initial"),
        ("jobs", "0002_counters_and_tuning"),
    ]

    operations = [migrations.RunSQL(forward, reverse) for forward, reverse in STEPS]
