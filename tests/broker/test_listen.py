"""broker/db/listen.py against the real database: LISTEN, notifications, the on_connect hook, and
reconnecting with backoff after the server drops the connection."""

from __future__ import annotations

import select
import time

import pytest
from django.db import connection

from broker.db.listen import Listener, payload_ids

pytestmark = pytest.mark.django_db(transaction=True)  # NOTIFY is delivered on commit


def notify(channel: str, payload: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def wait_for_ids(listener: Listener, timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    got: set[int] = set()
    while time.monotonic() < deadline and not got:
        got |= listener.wait(0.2) or set()
    return got


def test_payload_ids_skip_what_is_not_an_id():
    assert payload_ids(b"3,7") == {3, 7}
    assert payload_ids("12, x,,-4,5") == {12, 5}
    assert payload_ids(b"") == set()


def test_listen_notify_and_reconnect_after_the_connection_is_killed():
    connects = []
    listener = Listener(["broker_test_listen"], application_name="broker-test-listen",
                        on_connect=lambda conn: connects.append(conn.info.backend_pid), backoff=(0.2, 0.4))
    try:
        assert listener.fileno() is not None and len(connects) == 1
        notify("broker_test_listen", "4,9")
        notify("other_channel", "5")
        assert wait_for_ids(listener) == {4, 9}
        assert listener.received == 1

        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [connects[0]])
        # the next waits notice the loss (None), then reconnect after the backoff
        assert any(listener.wait(0.2) is None for _ in range(20))
        deadline = time.monotonic() + 10
        while len(connects) < 2 and time.monotonic() < deadline:
            listener.wait(0.1)
        assert len(connects) == 2 and connects[1] != connects[0]
        notify("broker_test_listen", "11")
        assert wait_for_ids(listener) == {11}
    finally:
        listener.close()
    assert listener.conn is None


def test_the_read_that_brings_the_servers_goodbye_reports_the_loss():
    """Issue 23 (the chaos test's lost LISTEN): a terminated backend sends a FATAL error, then closes.
    libpq takes an error that arrives between queries as a notice and reports nothing; the read that
    brought it must already say the connection is lost (None), not an empty set of ids."""
    connects = []
    listener = Listener(["broker_test_listen"], application_name="broker-test-listen-fatal",
                        on_connect=lambda conn: connects.append(conn.info.backend_pid), backoff=(0.2,))
    try:
        fd = listener.fileno()
        assert fd is not None
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [connects[0]])
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(5000), "the terminated connection never became readable"
        assert listener.drain() is None and listener.conn is None
    finally:
        listener.close()
