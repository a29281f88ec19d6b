"""The broker served by gunicorn as users run it, over real HTTP."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.processes import start_web

pytestmark = pytest.mark.django_db(transaction=True)


def test_gunicorn_serves_publish_and_reads(tmp_path):
    web = start_web(tmp_path, workers=2)
    try:
        admin = {"X-Broker-Admin-Token": ADMIN_TOKEN}
        assert requests.put(f"{web.url}/channel/live", data={"token": "lt"}, headers=admin).status_code == 200
        assert requests.put(f"{web.url}/producer/lp", data={"token": "pt"}, headers=admin).status_code == 200
        r = requests.post(f"{web.url}/channel/live/broadcast", data=b"hello", headers={
            "X-Broker-Channel-Token": "lt", "X-Broker-Producer-ID": "lp", "X-Broker-Producer-Token": "pt",
            "Content-Type": "text/plain", "X-Broker-Message-ID": "x1"})
        assert r.status_code == 201 and r.headers["Location"] == "/channel/live/message/x1"
        got = requests.get(f"{web.url}/channel/live/message/x1", headers={"X-Broker-Channel-Token": "lt"})
        assert got.json()["Payload"] == "hello"
        missing = requests.get(f"{web.url}/no/such/path")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    finally:
        web.stop()
