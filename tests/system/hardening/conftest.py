"""Hardening tests reuse the push fixtures (a real receiver on 127.0.0.1, in-process dispatchers)
and stop the long-poll LISTEN thread before the test database is dropped."""

from tests.jobs.conftest import dispatcher, push_settings, push_world, receiver  # noqa: F401
from tests.jobs.pull.conftest import _stop_wakeup_listener  # noqa: F401
