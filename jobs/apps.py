from django.apps import AppConfig
from django.db.backends.signals import connection_created


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Signal receivers. These modules (and django_q.signals) import models, which Django
        allows only once the app registry is ready: hence imports here (the allow-list of
        tests/system/architecture/test_no_function_imports.py names this method)."""
        from django_q.signals import post_spawn

        from broker.db.run import connection_plan_setup
        from jobs.advisories.record import advisory_recorded
        from jobs.publish.messages import advisory_publish
        from jobs.tasks import on_worker_spawn

        # Each django-q2 worker asks for a push dispatcher loop as it starts (jobs/tasks.py).
        post_spawn.connect(on_worker_spawn, dispatch_uid="jobs.push_dispatch_on_spawn")
        # How the hot prepared statements are planned (broker.db.run.PLAN_CACHE_MODE).
        connection_created.connect(connection_plan_setup, dispatch_uid="jobs.plan_cache_mode")
        # Advisories published to BROKER_ADVISORY_CHANNEL (jobs.advisories cannot import jobs.publish).
        advisory_recorded.connect(advisory_publish, dispatch_uid="jobs.advisory_publish")
