"""``manage.py broker_upgrade_check``: before ``migrate`` in a rolling deploy (docs/upgrades.md),
what the pending migrations will do to this live database."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.schema_editor import LOCK_ATTEMPTS, LOCK_TIMEOUT
from broker.upgrades import pending_plans, transactions_long


class Command(BaseCommand):
    help = ("List the pending migrations and, for each, whether it is online-safe and the strongest lock "
            "it takes (on which table, with its current size); then the long transactions a migration "
            "would wait behind. Exit status 1 with --strict when a migration is not online-safe.")

    def add_arguments(self, parser):
        parser.add_argument("--strict", action="store_true", help="exit 1 unless every pending migration is online-safe")
        parser.add_argument("--long-transaction", type=int, default=30,
                            help="seconds after which an open transaction is listed (default 30)")
        parser.add_argument("--sql", action="store_true", help="show every statement with its lock")

    def handle(self, *args, strict: bool, long_transaction: int, sql: bool, **options):
        plans = pending_plans()
        if not plans:
            self.stdout.write("no pending migrations")
        for plan in plans:
            strongest = plan.strongest
            lock = strongest.describe() if strongest else "none"
            self.stdout.write(f"{plan.label}  online-safe: {plan.verdict}  lock: {lock}")
            for warning in plan.warnings:
                self.stdout.write(f"    unsafe: {warning}")
            if plan.python:
                self.stdout.write(f"    {plan.python} RunPython step(s): their locks and run time are their own; review them")
            for step in plan.steps if sql else [s for s in plan.steps if s.blocking]:
                self.stdout.write(f"    {step.describe()}\n      {' '.join(step.sql.split())[:300]}")
        if plans:
            self.stdout.write(f"every statement waits at most {LOCK_TIMEOUT} for its lock, {LOCK_ATTEMPTS} tries "
                              f"(broker.schema_editor)")
        waiting = transactions_long(long_transaction)
        for pid, application, seconds, state, query in waiting:
            self.stdout.write(f"long transaction: pid {pid} ({application or '?'}) open {seconds} s, {state}: {query}")
        if not waiting:
            self.stdout.write(f"no transaction open longer than {long_transaction} s")
        if strict and any(not p.online_safe for p in plans):
            raise CommandError("a pending migration is not online-safe (see above; docs/upgrades.md)")
