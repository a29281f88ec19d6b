#!/usr/bin/env python
"""Django's command-line utility for the broker."""
import os
import sys

from django.core.management import execute_from_command_line

from broker.db.urls import DatabaseUrlError
from broker.embedded_db import database_url_ensure


def main() -> None:
    """Start the embedded PostgreSQL when DATABASE_URL is unset (the explicit step: importing settings
    never starts it), then run the command."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    try:
        database_url_ensure()
    except DatabaseUrlError as exc:
        sys.exit(str(exc))  # one line naming the part of DATABASE_URL it refused
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
