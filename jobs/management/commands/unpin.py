"""``manage.py unpin CHANNEL CONSUMER [--group G]``: release the pin of a priority group."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.errors import DomainError
from consumers.models import Consumer
from jobs.pull.groups import group_unpin, target_for


class Command(BaseCommand):
    help = ("Release the pin of a pull consumer's priority group (pinned_client policy), as "
            "POST /channel/{cid}/consumer/{conid}/unpin does: an UNPINNED advisory (reason admin) is "
            "recorded and the next job pins another waiting pull. Without --group, every group of the consumer.")

    def add_arguments(self, parser):
        parser.add_argument("channel", help="channel id")
        parser.add_argument("consumer", help="consumer id")
        parser.add_argument("--group", help="the priority group (default: all groups of the consumer)")

    def handle(self, *args, channel, consumer, group=None, **options):
        found = Consumer.objects.select_related("channel").filter(
            channel__channel_id=channel, consumer_id=consumer).first()
        if found is None:
            raise CommandError(f"consumer {channel}/{consumer} not found")
        groups = [group] if group is not None else list(found.priority_groups or [])
        if not groups:
            raise CommandError(f"consumer {channel}/{consumer} has no priority groups")
        for name in groups:
            try:
                result = group_unpin(target=target_for(found), group=name, reason="admin")
            except DomainError as exc:
                raise CommandError(exc.detail) from None
            if result["Unpinned"]:
                self.stdout.write(f"group {name}: released pin {result['PreviousPinId']}")
            else:
                self.stdout.write(f"group {name}: was not pinned")
