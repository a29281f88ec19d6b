"""Create (or recreate) the broker's django-q2 schedules. Idempotent: by name, in one transaction."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction
from django_q.models import Schedule

# name -> (function, minutes). django-q2 schedules run at most once a minute; everything that
# must run more often happens inside the push dispatcher loops (jobs/push/dispatcher.py).
SCHEDULES = {
    "broker-push-ensure": ("jobs.tasks.push_dispatch_ensure", 1),  # restart dispatcher loops if none run
    "broker-maintenance": ("jobs.tasks.maintenance", 1),  # sweeps when no loop runs
}


def schedules_setup() -> list[str]:
    with transaction.atomic():
        Schedule.objects.filter(name__in=list(SCHEDULES)).delete()
        for name, (func, minutes) in SCHEDULES.items():
            Schedule.objects.create(name=name, func=func, schedule_type=Schedule.MINUTES, minutes=minutes,
                                    repeats=-1)
    return list(SCHEDULES)


class Command(BaseCommand):
    help = "Create the broker's django-q2 schedules (push dispatcher safety net, sweeps). Idempotent."

    def handle(self, *args, **options):
        names = schedules_setup()
        if options["verbosity"]:
            self.stdout.write(f"schedules: {', '.join(names)}")
