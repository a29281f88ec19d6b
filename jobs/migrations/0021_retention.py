"""Retention in the broker (jobs.sweeps.retention): the sweep's cursors and last run, autovacuum
settings for the tables it deletes from, and a deleted consumer's retention counters go with it.

- ``broker_message``, ``jobs_jobtransition``, ``jobs_deliveryattempt``: a steady stream of deletes
  at the old end (and, for the history, of inserts). With the default scale factor (20 % of the
  table) dead tuples pile up to a fifth of the table before a vacuum, and a small retention (a
  busy channel kept for minutes) churns the table many times between two; vacuumed from 2 % + 1000
  rows instead (``jobs_job`` has had its own settings since migration 0002).
- ``consumers_forget_delivery_metrics`` (migration 0014): also drops the consumer's retention
  counters (scope 25, ``broker.counters.RETENTION_CONSUMER``); reversing restores 0014's function.
"""

import django.db.models.deletion
from django.db import migrations, models

# frozen copies of broker.counters (a migration must not change when the code does)
DELIVERY = 4
RETENTION_CONSUMER = 25

FORWARD = f"""
ALTER TABLE broker_message SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE jobs_jobtransition SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE jobs_deliveryattempt SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);

CREATE OR REPLACE FUNCTION consumers_forget_delivery_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM broker_counter WHERE scope IN ({DELIVERY}, {RETENTION_CONSUMER})
       AND owner_id IN (SELECT id FROM old_rows);
    DELETE FROM broker_counterdelta WHERE scope IN ({DELIVERY}, {RETENTION_CONSUMER})
       AND owner_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END $$;
"""

REVERSE = f"""
ALTER TABLE broker_message RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE jobs_jobtransition RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE jobs_deliveryattempt RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);

CREATE OR REPLACE FUNCTION consumers_forget_delivery_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM broker_counter WHERE scope = {DELIVERY} AND owner_id IN (SELECT id FROM old_rows);
    DELETE FROM broker_counterdelta WHERE scope = {DELIVERY} AND owner_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0006_channel_retention'),
        ('jobs', '0020_plan_checks'),
    ]

    operations = [
        migrations.CreateModel(
            name='RetentionCursor',
            fields=[
                ('channel', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='broker.channel')),
                ('tip_at', models.DateTimeField(null=True)),
                ('tip_id', models.BigIntegerField(default=0)),
                ('sweep_at', models.DateTimeField(null=True)),
                ('sweep_id', models.BigIntegerField(null=True)),
                ('sweep_started_at', models.DateTimeField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name='RetentionRun',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('started_at', models.DateTimeField()),
                ('seconds', models.FloatField()),
                ('removed', models.BigIntegerField(default=0)),
                ('batches', models.PositiveIntegerField(default=0)),
            ],
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
