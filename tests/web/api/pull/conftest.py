"""The pull routes' tests use the pull fixtures of tests/jobs/pull (a pull client, the wake-up
listener stopped with the session)."""

from tests.jobs.pull.conftest import _stop_wakeup_listener, pc  # noqa: F401
