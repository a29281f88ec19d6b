#!/usr/bin/env python
"""Django's command-line utility for the broker."""
import os
import sys

from django.core.management import execute_from_command_line

from broker.embedded_db import database_url_ensure


def main() -> None:
    """Start the embedded PostgreSQL when DATABASE_URL is unset (the explicit step: importing settings
    never starts it), then run the command."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    database_url_ensure()
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
