"""Shared fixtures: an API client with the admin token, and helpers to make broker objects.

Tests run against a real PostgreSQL: a fresh embedded server per session (started by the plugin
tests/pg_session.py) unless DATABASE_URL is set.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings as hypothesis_settings
from rest_framework.test import APIClient

# Property tests judge what the code does, never how fast: no per-example deadline and no "input
# generation is slow" health check, which fail on a busy 2-core machine (CI shares its cores with
# the suite's servers) while the properties hold.
hypothesis_settings.register_profile("broker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("broker")

ADMIN_TOKEN = "test-admin-token"
LOOPBACK_ALLOW = "127.0.0.1,::1,localhost"


@pytest.fixture(autouse=True)
def _admin_token(settings):
    settings.BROKER_ADMIN_TOKEN = ADMIN_TOKEN
    # The callback policy stays on (as in production), with the test receivers' loopback allowed.
    settings.BROKER_CALLBACK_DENY_PRIVATE = True
    settings.BROKER_CALLBACK_ALLOW = LOOPBACK_ALLOW


@pytest.fixture(scope="session", autouse=True)
def _close_wakeup_notifier(django_db_setup, django_db_blocker):
    """Publishes open this process's wake-up connection (jobs.publish.wakeup) and, outside a test's
    transaction, its publishing thread's (jobs.publish.grouped); close them before the test database
    is dropped."""
    yield
    from jobs.publish.grouped import grouped_publisher_close
    from jobs.publish.wakeup import jobs_notifier

    jobs_notifier.close()
    grouped_publisher_close()


@pytest.fixture(autouse=True)
def _close_refusal_tally(django_db_blocker):
    """Publishes refused outside a test's transaction start this process's refusal tally thread
    (jobs.publish.refusals): write what it holds and stop it at the test's end, so it never writes
    into the next test (as the sources' tally once did: tests/sources/conftest.py)."""
    yield
    from jobs.publish.refusals import publish_refusals_close

    with django_db_blocker.unblock():
        publish_refusals_close()


@pytest.fixture
def short_tmp():
    """A fresh directory with a short path, for AF_UNIX sockets (their paths end at 107 bytes):
    under pytest-xdist, tmp_path is deeper (.../popen-gw0/<test name>0/)."""
    path = Path(tempfile.mkdtemp(prefix="bt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def client_anon():
    return APIClient()


@pytest.fixture
def api():
    """Client sending the admin token on every request."""
    client = APIClient()
    client.credentials(HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN)
    return client


class Factory:
    """Creates channels, producers and consumers through the HTTP API, as a user would."""

    def __init__(self, api):
        self.api = api

    def channel(self, cid="ch1", token="ch-token"):
        r = self.api.put(f"/channel/{cid}", {"token": token, "name": cid.upper()})
        assert r.status_code == 200, r.content
        return r.json()

    def producer(self, pid="p1", token="p-token"):
        r = self.api.put(f"/producer/{pid}", {"token": token})
        assert r.status_code == 200, r.content
        return r.json()

    def basics(self):
        """Channel ch1 (token ch-token) and producer p1 (p-token): what most tests publish through."""
        self.channel()
        self.producer()
        return self

    def consumer(self, cid="c1", channel="ch1", token="c-token", type="push",
                 callback="http://127.0.0.1:9/cb", **extra):
        data = {"token": token, "type": type, **extra}
        if callback is not None:
            data["callbackUrl"] = callback
        r = self.api.put(f"/channel/{channel}/consumer/{cid}", data)
        assert r.status_code == 200, r.content
        return r.json()

    def publish(self, channel="ch1", body=b'{"hello": "world"}', *, channel_token="ch-token",
                producer="p1", producer_token="p-token", content_type="application/json", **headers):
        extra = {k if k.startswith("HTTP_") else f"HTTP_{k.upper().replace('-', '_')}": v
                 for k, v in headers.items()}
        return APIClient().generic(
            "POST", f"/channel/{channel}/broadcast", body, content_type=content_type,
            HTTP_X_BROKER_CHANNEL_TOKEN=channel_token, HTTP_X_BROKER_PRODUCER_ID=producer,
            HTTP_X_BROKER_PRODUCER_TOKEN=producer_token, **extra,
        )


@pytest.fixture
def make(api):
    return Factory(api)


@pytest.fixture
def world(make):
    """A channel ch1 (token ch-token), producer p1 (p-token), push consumer c1 and pull consumer c2."""
    make.basics()
    make.consumer("c1")
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    return make


# --- DB-free unit tests ---------------------------------------------------------------------------
# Every test under a ``unit/`` folder is marked ``unit``: pure rules, no database. ``make unit`` runs
# them with DATABASE_URL pointing at a closed port, so no PostgreSQL is started or reached; a unit
# test that asks for a database fixture is refused at collection.
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
               "live_server"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "unit" not in item.path.relative_to(config.rootpath).parts[:-1]:
            continue
        item.add_marker(pytest.mark.unit)
        wanted = DB_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if wanted or item.get_closest_marker("django_db"):
            raise pytest.UsageError(f"{item.nodeid}: a unit test may not use the database ({sorted(wanted)})")


@pytest.fixture(autouse=True)
def _event_types_rules():
    """Each process caches its channels' event types (eventtypes.validation) by a generation number
    that a test's rolled-back transaction takes back: forget them after every test."""
    yield
    from eventtypes.validation import cache_clear

    cache_clear()
