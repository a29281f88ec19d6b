"""``manage.py broker_stats``: the dashboard in a terminal (or as JSON for scripts and cron)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from broker.models import Channel
from jobs.ops.dashboard import dashboard_snapshot, duration_text


class Command(BaseCommand):
    help = (
        "Print, per channel and consumer, jobs queued / in flight / delivered / dead, the oldest queued "
        "job, deliveries per minute and the failure rate over the last hour, and the alerts: the same "
        "figures as the admin dashboard (maintained counters, never a full count). --json for scripts; "
        "--check exits with status 2 when there is an error-level alert."
    )

    def add_arguments(self, parser):
        parser.add_argument("--channel", action="append", dest="channels", metavar="ID",
                            help="only this channel (repeatable)")
        parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        parser.add_argument("--check", action="store_true", help="exit status 2 if any error-level alert")

    def handle(self, *args, channels=None, json=False, check=False, **options):
        pks = None
        if channels:
            found = dict(Channel.objects.filter(channel_id__in=channels).values_list("channel_id", "pk"))
            missing = sorted(set(channels) - set(found))
            if missing:
                raise CommandError(f"unknown channel: {', '.join(missing)}")
            pks = list(found.values())
        dash = dashboard_snapshot(channel_pks=pks)
        if json:
            self.stdout.write(_dumps(_as_dict(dash)))
        else:
            self._table(dash)
        if check and any(a.level == "error" for a in dash.alerts):
            raise SystemExit(2)

    def _table(self, dash) -> None:
        head = ("consumer", "type", "queued", "in flight", "delivered", "dead", "oldest", "deliv/min", "failed 1h",
                "alerts")
        rows = []
        for ch in dash.channels:
            for c in ch.consumers:
                rows.append((
                    f"{ch.channel.channel_id}/{c.consumer.consumer_id}", c.consumer.type, f"{c.queued:,}",
                    f"{c.inflight:,}", f"{c.delivered:,}", f"{c.dead:,}",
                    duration_text(c.oldest_queued_age) if c.oldest_queued_age is not None else "-",
                    f"{c.delivered_per_minute:,.1f}", "-" if c.failure_rate is None else f"{c.failure_rate:.1%}",
                    ",".join(a.kind for a in c.alerts) or "-",
                ))
        widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
        right = {2, 3, 4, 5, 6, 7, 8}
        for r in (head, *rows):
            self.stdout.write("  ".join(str(v).rjust(w) if i in right else str(v).ljust(w)
                                        for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
        if not rows:
            self.stdout.write("(no consumers)")
        self.stdout.write("")
        self.stdout.write(f"as of {dash.now:%Y-%m-%d %H:%M:%S %Z}: {dash.total('queued'):,} queued, "
                          f"{dash.total('inflight'):,} in flight, {dash.total('dead'):,} dead, "
                          f"{dash.total('delivered_per_minute'):,.1f} delivered/min")
        for a in dash.alerts:
            where = ""
            for c in dash.consumers:
                if c.consumer.pk == a.consumer_pk:
                    where = f"{c.consumer.channel.channel_id}/{c.consumer.consumer_id}: "
            line = f"{a.level.upper()}: {where}{a.text}"
            self.stdout.write(self.style.ERROR(line) if a.level == "error" else self.style.WARNING(line))


def _as_dict(dash) -> dict:
    return {
        "now": dash.now.isoformat(),
        "channels": [{
            "channel": ch.channel.channel_id,
            "messages": ch.messages,
            "scheduled": ch.scheduled,
            "consumers": [{
                "consumer": c.consumer.consumer_id, "type": c.consumer.type,
                "queued": c.queued, "inflight": c.inflight, "delivered": c.delivered, "dead": c.dead,
                "redelivered": c.redelivered, "oldest_queued_seconds": c.oldest_queued_age,
                "delivered_per_minute": c.delivered_per_minute, "failure_rate_1h": c.failure_rate,
                "backlog_growth_10m": c.backlog_growth,
                "delivered_per_minute_1h": c.series.delivered, "failed_per_minute_1h": c.series.failed,
                "alerts": [{"level": a.level, "kind": a.kind, "text": a.text} for a in c.alerts],
            } for c in ch.consumers],
        } for ch in dash.channels],
        "alerts": [{"level": a.level, "kind": a.kind, "text": a.text} for a in dash.alerts if a.consumer_pk is None],
    }


def _dumps(data) -> str:
    return json.dumps(data, indent=2)
