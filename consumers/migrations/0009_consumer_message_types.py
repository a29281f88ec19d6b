"""Issue 17 filters: a consumer's type patterns (NULL: every message), read by the fan-out statement."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0008_pullwaiter_no_fk_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='consumer',
            name='message_types',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=130), blank=True, null=True, size=None),
        ),
    ]
