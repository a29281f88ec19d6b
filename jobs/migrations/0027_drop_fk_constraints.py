"""jobs_job without its two FK constraints (message, consumer): a check per job at the publish's
commit, so the fan-out's size in checks on every publish. The statements guard what they did
(docs/architecture.md, "Integrity without foreign keys"): a job is inserted by the statement that
inserts its message, or by a replay that holds the message FOR KEY SHARE; every job insert locks its
consumer FOR KEY SHARE, and consumer_delete locks the consumer FOR UPDATE before deleting its jobs.
``DROP CONSTRAINT`` is a catalog change (an instant ACCESS EXCLUSIVE under the editor's lock_timeout)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0010_drop_fk_constraints'),
        ('consumers', '0011_filters_circuit_open_after'),
        ('jobs', '0026_counter_fold_skips_empty'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='consumer',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='consumers.consumer'),
        ),
        migrations.AlterField(
            model_name='job',
            name='message',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='broker.message'),
        ),
    ]
