"""``message_channel_received``: one channel's messages by receive time (then id).

Serves replay (``replay_chunk`` in jobs/publish/queries.sql), which walks a channel's messages in a time
window in chunks of 10,000 by keyset ``(received_at, id) > (last seen)``. Built CONCURRENTLY so
a large live message table keeps taking publishes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ('broker', '0003_producer_rate_limit'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(fields=['channel', 'received_at', 'id'], name='message_channel_received'),
        ),
    ]
