"""Receipts (issue 23): ``jobs_job.receipt``, set by every claim from the sequence
``jobs_job_receipt_seq`` (owned by the column, so it goes with the table). A nullable column
without a default: adding it rewrites nothing."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_plan_checks'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='receipt',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunSQL(
            sql="CREATE SEQUENCE jobs_job_receipt_seq OWNED BY jobs_job.receipt",
            reverse_sql="DROP SEQUENCE IF EXISTS jobs_job_receipt_seq",
        ),
    ]
