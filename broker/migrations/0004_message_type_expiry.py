"""Issue 17: a message's type (filters) and expiry, a channel's default TTL, and both kept on a
scheduled message until it is published. Nullable columns: nothing is rewritten."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0003_producer_rate_limit'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='message_ttl',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='message',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='message',
            name='type',
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
        migrations.AddField(
            model_name='scheduledmessage',
            name='ttl',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='scheduledmessage',
            name='type',
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
    ]
