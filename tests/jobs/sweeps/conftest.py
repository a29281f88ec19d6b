"""The sweeps' tests drive jobs through the pull protocol: the pull fixtures (a pull client, the
wake-up listener stopped with the session)."""

from tests.jobs.pull.conftest import _stop_wakeup_listener, pc  # noqa: F401
