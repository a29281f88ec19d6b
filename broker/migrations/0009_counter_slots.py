"""The counter deltas' table is SQL's from here (jobs migration 0023 partitions it by time slot and
indexes it on (scope, owner_id, status)): its index leaves the model's state. The model stays
managed, so Django's flush still empties it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0008_channel_event_types"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveIndex(model_name="counterdelta", name="counterdelta_owner"),
        ]),
    ]
