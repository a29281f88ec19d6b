"""A channel's retention (seconds; null: BROKER_RETENTION), read by jobs.sweeps.retention."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0005_merge_type_expiry_channel_received'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='retention',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
