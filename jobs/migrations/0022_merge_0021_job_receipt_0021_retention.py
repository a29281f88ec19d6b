"""Joins the receipts (issue 23) and the retention (issue 24) branches of the jobs migrations."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0021_job_receipt'),
        ('jobs', '0021_retention'),
    ]

    operations = [
    ]
