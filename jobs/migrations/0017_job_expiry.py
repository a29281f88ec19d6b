"""Expiry (issue 17 part 3): ``jobs_job.expires_at``, the message's expiry copied at fan-out so the
claims test it on the job row, and ``job_queued_expiry`` serving the expiry sweep
(``jobs.sweeps.message_expiry._EXPIRE_MESSAGES_SQL``): QUEUED jobs that have an expiry, by expiry. Adding a nullable
column rewrites nothing; the partial index is built CONCURRENTLY so a large live table keeps taking
writes (it holds no row until messages carry a TTL)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ('broker', '0004_message_type_expiry'),
        ('consumers', '0009_consumer_message_types'),
        ('jobs', '0016_inflight_by_consumer'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('status', 1001)),
                               fields=['expires_at'], name='job_queued_expiry'),
        ),
    ]
