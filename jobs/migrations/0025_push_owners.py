"""Push claims know their dispatcher (issue 38 item 10): ``jobs_job.claimed_by`` (nullable, no
default: a catalog change, no rewrite of a large table) and ``jobs_pushowner``, one row per live
push dispatcher engine (jobs.push.owners, jobs.sweeps.orphans)."""

from django.db import migrations, models
import django.db.models.functions.datetime


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0024_indexes_by_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="claimed_by",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="PushOwner",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("pid", models.IntegerField()),
                ("backend_start", models.DateTimeField(null=True)),
                ("registered_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
    ]
