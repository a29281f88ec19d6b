"""Priority groups in the admin and on the command line: the "Unpin" action and ``manage.py unpin``
release a pin through the same service as POST .../unpin (advisory reason admin)."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from consumers.models import Advisory, Consumer
from tests.jobs.pull.conftest import PullClient, publish_n
from tests.processes import ROOT

pytestmark = pytest.mark.django_db

URL = "/admin/consumers/consumer/"


@pytest.fixture
def pinned(world, api, client_anon, make):
    r = api.put("/channel/ch1/consumer/pn", {"token": "pnt", "type": "pull", "priorityPolicy": "pinned_client",
                                             "priorityGroups": ["A"]}, format="json")
    assert r.status_code == 200, r.content
    publish_n(make, 2)
    pc = PullClient(client_anon, "/channel/ch1/consumer/pn",
                    {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "pnt"})
    r = pc.pull(group="A")
    pin = r["X-Broker-Pin-Id"]
    assert pin
    return Consumer.objects.get(consumer_id="pn"), pin, pc


def test_change_page_shows_the_pin_and_the_unpin_action_releases_it(admin_client, pinned):
    consumer, pin, pc = pinned
    page = admin_client.get(f"{URL}{consumer.pk}/change/")
    assert page.status_code == 200
    assert pin in page.content.decode() and "consumer_group_pinned" in page.content.decode()
    r = admin_client.post(URL, {"action": "unpin", "_selected_action": [consumer.pk]}, follow=True)
    assert r.status_code == 200
    assert "Unpinned ch1/pn group A" in r.content.decode()
    assert [(a.type, a.data) for a in Advisory.objects.order_by("id")] == [
        ("consumer_group_pinned", {"pinned_id": pin}), ("consumer_group_unpinned", {"reason": "admin"})]
    assert pc.stats()["PriorityGroups"] == [{"group": "A"}]
    r = admin_client.post(URL, {"action": "unpin", "_selected_action": [consumer.pk]}, follow=True)
    assert "No pinned priority group" in r.content.decode()
    new = pc.pull(group="A")["X-Broker-Pin-Id"]
    assert new and new != pin
    assert "Advisor" in admin_client.get("/admin/consumers/advisory/").content.decode()


def test_unpin_command(pinned):
    consumer, pin, pc = pinned
    out = StringIO()
    call_command("unpin", "ch1", "pn", "--group", "A", stdout=out)
    assert f"released pin {pin}" in out.getvalue()
    out = StringIO()
    call_command("unpin", "ch1", "pn", stdout=out)
    assert "was not pinned" in out.getvalue()
    with pytest.raises(CommandError, match="does not exist"):
        call_command("unpin", "ch1", "pn", "--group", "B")
    with pytest.raises(CommandError, match="not found"):
        call_command("unpin", "ch1", "nope")


def test_unpin_command_help():
    r = subprocess.run([sys.executable, "manage.py", "unpin", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "BROKER_TESTING": "1"})
    assert r.returncode == 0, r.stderr
    assert "usage: manage.py unpin" in r.stdout and "UNPINNED" in r.stdout
