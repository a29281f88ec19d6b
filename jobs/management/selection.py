"""The consumer selection shared by the bulk job commands (``purge_queued``, ``requeue_dead``):
``--channel [--consumer]`` or ``--all``, worked through in ``--batch`` sized statements."""

from __future__ import annotations

from django.core.management.base import CommandError

from consumers.models import Consumer


def consumer_arguments(parser) -> None:
    parser.add_argument("--channel", help="channel id (all its consumers unless --consumer is given)")
    parser.add_argument("--consumer", help="consumer id within --channel")
    parser.add_argument("--all", action="store_true", help="every consumer of every channel")
    parser.add_argument("--batch", type=int, default=5000, help="jobs per statement (default 5000)")


def consumers_select(*, channel: str | None, consumer: str | None, all: bool, batch: int) -> list[Consumer]:
    """The selected consumers, by channel then consumer id (may be empty); a bad combination of
    options is a CommandError."""
    if batch < 1:
        raise CommandError("--batch must be at least 1")
    if all == bool(channel):
        raise CommandError("give --channel (optionally with --consumer) or --all")
    if consumer and not channel:
        raise CommandError("--consumer needs --channel")
    consumers = Consumer.objects.select_related("channel").order_by("channel__channel_id", "consumer_id")
    if channel:
        consumers = consumers.filter(channel__channel_id=channel)
        if consumer:
            consumers = consumers.filter(consumer_id=consumer)
    return list(consumers)
