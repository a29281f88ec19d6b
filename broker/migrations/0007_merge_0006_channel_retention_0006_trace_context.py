"""Joins the channel retention (issue 24) and the trace context (issue 25) branches of the broker migrations."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0006_channel_retention'),
        ('broker', '0006_trace_context'),
    ]

    operations = [
    ]
