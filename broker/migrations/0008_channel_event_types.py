"""A channel's eventTypes (issue 37): open or closed, read by eventtypes.validation. A column with a
database default: instant, and older code inserting channels without it still works."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0007_merge_0006_channel_retention_0006_trace_context'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='event_types',
            field=models.CharField(choices=[('open', 'open'), ('closed', 'closed')], db_default='open', default='open', max_length=8),
        ),
    ]
