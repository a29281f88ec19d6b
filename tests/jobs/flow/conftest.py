"""Flow-control tests reuse the push fixtures: a real HTTP receiver and an in-process dispatcher."""

from tests.jobs.conftest import dispatcher, push_settings, push_world, receiver  # noqa: F401
