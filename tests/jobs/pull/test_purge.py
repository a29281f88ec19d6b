"""Purge a consumer's QUEUED jobs: DELETE .../queued-jobs, the management command, history rows."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from jobs.models import JobTransition

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/channel/ch1/consumer/{}/queued-jobs"


def stats(api, cid):
    r = api.get(f"/channel/ch1/consumer/{cid}")
    assert r.status_code == 200, r.content
    return r.json()


def test_purge_by_admin_and_tokens(world, api):
    for _ in range(7):
        assert world.publish().status_code == 201
    assert stats(api, "c2")["NumPending"] == 7
    # claim one: in-flight jobs stay
    r = APIClient().post("/channel/ch1/consumer/c2/pull", {"batch": 1}, format="json",
                         HTTP_X_BROKER_CHANNEL_TOKEN="ch-token", HTTP_X_BROKER_CONSUMER_TOKEN="c2-token")
    assert r.status_code == 200 and len(r.json()["Result"]) == 1
    r = APIClient().delete(URL.format("c2"), HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                           HTTP_X_BROKER_CONSUMER_TOKEN="c2-token")
    assert r.status_code == 200, r.content
    assert r.json() == {"deletedCount": 6}
    s = stats(api, "c2")
    assert s["NumPending"] == 0 and s["NumAckPending"] == 1
    assert JobTransition.objects.filter(reason="purged").count() == 6
    # push consumer via admin token; the GET listing still works
    r = api.delete(URL.format("c1"))
    assert r.status_code == 200 and r.json() == {"deletedCount": 7}
    assert api.get(URL.format("c2")).status_code == 200


def test_purge_auth_and_bad_input(world, api):
    assert APIClient().delete(URL.format("c2")).status_code == 401
    r = APIClient().delete(URL.format("c2"), HTTP_X_BROKER_CHANNEL_TOKEN="ch-token",
                           HTTP_X_BROKER_CONSUMER_TOKEN="wrong")
    assert r.status_code == 403
    assert APIClient().delete(URL.format("c2"), HTTP_X_BROKER_ADMIN_TOKEN="nope").status_code == 403
    assert api.delete(URL.format("nope")).status_code == 404
    r = api.delete(URL.format("c2") + "?olderThan=yesterday")
    assert r.status_code == 400 and r.json()["error"] == "invalid_olderThan"


def test_purge_older_than(world, api):
    for _ in range(3):
        world.publish()
    # nothing is older than an hour
    r = api.delete(URL.format("c2") + "?olderThan=3600")
    assert r.json() == {"deletedCount": 0}
    r = api.delete(URL.format("c2") + "?olderThan=2000-01-01T00:00:00Z")
    assert r.json() == {"deletedCount": 0}
    r = api.delete(URL.format("c2") + "?olderThan=2999-01-01T00:00:00%2B00:00")
    assert r.json() == {"deletedCount": 3}
    world.publish()
    r = api.delete(URL.format("c2") + "?olderThan=0")
    assert r.json() == {"deletedCount": 1}


def test_purge_command_batches(world, api):
    for _ in range(5):
        world.publish()
    out = StringIO()
    call_command("purge_queued", "--channel", "ch1", "--consumer", "c2", "--batch", "2", stdout=out)
    text = out.getvalue()
    assert text.count("batch of") == 3 and "5 queued jobs purged" in text
    assert stats(api, "c2")["NumPending"] == 0
    assert stats(api, "c1")["NumPending"] == 5
