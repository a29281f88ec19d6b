"""Hardening tests reuse the push fixtures: a real receiver on 127.0.0.1 and in-process dispatchers."""

from tests.jobs.conftest import dispatcher, push_settings, push_world, receiver  # noqa: F401
