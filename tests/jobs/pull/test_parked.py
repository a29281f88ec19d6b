"""A waiting pull's connection while it sleeps (jobs.pull.wakeups.connection_parked): kept warm for
a few waiters per process, closed for the others, and closed after the sleep when the process's
LISTEN connection was lost or made again meanwhile (the server restarted: the kept one is dead too)."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.pull.wakeups import connection_parked, wakeups

pytestmark = pytest.mark.django_db(transaction=True)  # outside a transaction, as a serving request


def _open() -> None:
    connection.ensure_connection()
    assert connection.connection is not None


def test_a_waiter_keeps_its_connection_while_few_do(settings):
    settings.BROKER_PULL_WAIT_CONNECTIONS = 1
    _open()
    with connection_parked():
        assert connection.connection is not None  # kept: the first waiter of the process
        with connection_parked():  # a second waiter (same thread here): over the limit, closed
            assert connection.connection is None
    _open()
    with connection_parked():
        assert connection.connection is not None  # the count went back down


def test_a_kept_connection_is_closed_when_the_listener_reconnected_meanwhile(settings):
    settings.BROKER_PULL_WAIT_CONNECTIONS = 4
    _open()
    with connection_parked():
        pass
    assert connection.connection is not None  # nothing happened: still warm
    with connection_parked():
        wakeups.epoch += 1  # as the LISTEN thread does on a lost or new connection
    assert connection.connection is None  # the claim after the wake connects anew
