"""Hardening tests reuse the push fixtures (a real receiver on 127.0.0.1, in-process dispatchers)
and stop the long-poll LISTEN thread before the test database is dropped."""

import pytest
from django.core import signals
from django.db import close_old_connections

from tests.jobs.conftest import dispatcher, push_settings, push_world, receiver  # noqa: F401
from tests.jobs.pull.conftest import _stop_wakeup_listener  # noqa: F401


@pytest.fixture
def keep_test_connection():
    """Calling the WSGI app directly (the schemathesis tests) fires request_finished, which would
    close the connection holding the test transaction; Django's own test client disconnects it the
    same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)
