from django.conf import settings
from django.core.management.base import BaseCommand

from broker.embedded_db import server_stop


class Command(BaseCommand):
    help = "Show or stop the embedded PostgreSQL server (used when DATABASE_URL is not set)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["url", "stop"])

    def handle(self, *args, action: str, **options):
        if action == "url":
            self.stdout.write(settings.DATABASE_URL)
        else:
            stopped = server_stop(settings.BROKER_DATA_DIR / "postgres")
            self.stdout.write("stopped" if stopped else "not running")
