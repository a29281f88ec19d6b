"""jobs_pushowner.lag and lag_at: each dispatcher engine's report of how far behind the push
deliveries are (jobs.push.lag), which publishing's admission reads (issue 34: shed a load the
deliveries cannot follow). Two nullable columns: a catalog change, old code writes neither."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0027_drop_fk_constraints'),
    ]

    operations = [
        migrations.AddField(
            model_name='pushowner',
            name='lag',
            field=models.FloatField(null=True),
        ),
        migrations.AddField(
            model_name='pushowner',
            name='lag_at',
            field=models.DateTimeField(null=True),
        ),
    ]
