from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each django-q2 worker asks for a push dispatcher loop as it starts (jobs/tasks.py).
        from django_q.signals import post_spawn

        from jobs.tasks import on_worker_spawn

        post_spawn.connect(on_worker_spawn, dispatch_uid="jobs.push_dispatch_on_spawn")

        # How the hot prepared statements are planned (jobs.state.PLAN_CACHE_MODE).
        from django.db.backends.signals import connection_created

        from jobs.state import connection_plan_setup

        connection_created.connect(connection_plan_setup, dispatch_uid="jobs.plan_cache_mode")
