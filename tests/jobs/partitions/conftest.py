"""Fixtures for partitions: the push receiver and dispatcher threads of tests/jobs, a short lease,
and helpers to publish into partitions and read partitions over HTTP."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from rest_framework.test import APIClient

from tests.jobs.conftest import DispatcherThread, Receiver, Reply, dispatcher, push_settings, receiver  # noqa: F401
from tests.jobs.pull.conftest import PullClient, _stop_wakeup_listener  # noqa: F401

LEASE = 1.5


@pytest.fixture
def part_settings(push_settings):
    push_settings.BROKER_PARTITION_LEASE_SECONDS = LEASE
    push_settings.BROKER_MAX_RETRY = 3
    return push_settings


class Parts:
    """Publishing with partition headers and the partition endpoints, for channel ch1."""

    def __init__(self, make, api):
        self.make = make
        self.api = api

    def publish(self, key, gate=None, body=b"{}", **headers):
        extra = {"HTTP_X_BROKER_PARTITION_KEY": key}
        if gate is not None:
            extra["HTTP_X_BROKER_GATE"] = str(gate)
        extra.update(headers)
        return self.make.publish(body=body, **extra)

    def url(self, consumer, key=None, action=""):
        base = f"/channel/ch1/consumer/{consumer}"
        if key is None:
            return f"{base}/partitions"
        return f"{base}/partition/{quote(key, safe='')}" + (f"/{action}" if action else "")

    def get(self, consumer, key):
        r = self.api.get(self.url(consumer, key))
        assert r.status_code == 200, r.content
        return r.json()

    def post(self, consumer, key, action, expect=200):
        r = self.api.post(self.url(consumer, key, action))
        assert r.status_code == expect, r.content
        return r.json()

    def patch(self, consumer, key, **data):
        r = self.api.generic("PATCH", self.url(consumer, key), json.dumps(data), content_type="application/json")
        assert r.status_code == 200, r.content
        return r.json()


@pytest.fixture
def parts(make, api):
    return Parts(make, api)


@pytest.fixture
def pull_world(make):
    """Channel ch1, producer p1, pull consumer c2 (token c2-token)."""
    make.channel()
    make.producer()
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    return make


@pytest.fixture
def pc():
    return PullClient(APIClient())


def advisories(api, consumer):
    r = api.get(f"/channel/ch1/consumer/{consumer}/advisories")
    assert r.status_code == 200, r.content
    body = r.json()
    return body.get("Advisories", body.get("Result", body)) if isinstance(body, dict) else body
