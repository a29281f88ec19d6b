from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from consumers.seed import seed_from_file


class Command(BaseCommand):
    help = "Seed channels, producers and consumers from a webhook-broker INI file (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--config", default=settings.BROKER_SEED_CONFIG,
                            help="INI file (default: BROKER_SEED_CONFIG)")

    def handle(self, *args, config=None, **options):
        if not config:
            raise CommandError("give --config FILE or set BROKER_SEED_CONFIG")
        try:
            plan, created = seed_from_file(config)
        except OSError as exc:
            raise CommandError(f"cannot read {config}: {exc}") from exc
        for error in plan.errors:
            self.stderr.write(f"skipped: {error}")
        self.stdout.write(
            f"seeded {len(plan.channels)} channels, {len(plan.producers)} producers, "
            f"{len(plan.consumers)} consumers (new: {created['channels']}/{created['producers']}/{created['consumers']})"
            + (f", {len(plan.event_types)} event types (new: {created.get('event_types', 0)})" if plan.event_types else "")
        )
