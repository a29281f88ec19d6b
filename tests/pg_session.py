"""pytest plugin (``-p tests.pg_session`` in pyproject's addopts): the test session's explicit
database step. Without DATABASE_URL it starts a fresh throw-away embedded PostgreSQL and exports its
URL before pytest-django imports the settings (which only read the environment); test servers and
workers started as child processes inherit it. With DATABASE_URL set, that server is used."""

from __future__ import annotations

import os

import pytest

from broker.embedded_db import throwaway_server_start


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Runs before pytest-django's implementation of this hook, which loads the settings."""
    if not os.environ.get("DATABASE_URL") and not getattr(early_config.known_args_namespace, "help", False):
        throwaway_server_start()
    return (yield)
