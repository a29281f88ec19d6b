from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each django-q2 worker asks for a push dispatcher loop as it starts (jobs/tasks.py).
        from django_q.signals import post_spawn

        from jobs.tasks import on_worker_spawn

        post_spawn.connect(on_worker_spawn, dispatch_uid="jobs.push_dispatch_on_spawn")
