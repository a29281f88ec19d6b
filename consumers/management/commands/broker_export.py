"""``manage.py broker_export``: the registry as a seed INI (consumers.export), read back by ``seed``.

An export that left something out (a consumer id used on two channels: the seed format names
consumers by id) is not a backup: the command writes it, says what is missing and exits 1, unless
``--allow-partial`` says a partial file is what the caller wants (a script's ``&&`` then goes on)."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from consumers.export import registry_export


class Command(BaseCommand):
    help = ("Write the registry (channels, producers, consumers with every setting, priority groups, "
            "retention) as a seed INI that `seed --config` reads back; tokens and signing secrets only "
            "with --with-secrets.")

    def add_arguments(self, parser):
        parser.add_argument("--with-secrets", action="store_true",
                            help="include tokens and signing secrets (needed to restore; keep the file private)")
        parser.add_argument("--output", "-o", help="write to this file (mode 600) instead of standard output")
        parser.add_argument("--allow-partial", action="store_true",
                            help="exit 0 even when something was left out (listed on standard error)")

    def handle(self, *args, with_secrets: bool, output: str | None, allow_partial: bool = False, **options):
        text, problems = registry_export(with_secrets=with_secrets)
        for problem in problems:
            self.stderr.write(f"left out: {problem}")
        if output:
            with open(output, "w", encoding="utf-8", opener=lambda path, flags: os.open(path, flags, 0o600)) as fh:
                fh.write(text)
        else:
            self.stdout.write(text, ending="")
        if problems and not allow_partial:
            raise CommandError(f"partial export: {len(problems)} left out (listed above); a restore from this file "
                               "would miss them. --allow-partial accepts it")
