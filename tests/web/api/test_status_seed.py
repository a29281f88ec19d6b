"""/_status shows the seed this process applied: brokers sharing a database each show their own."""

from __future__ import annotations

import pytest
import requests
from rest_framework.test import APIClient

from consumers.seed import seed_apply, seed_parse
from tests.conftest import ADMIN_TOKEN
from tests.processes import start_web

SEED = """
[initial-channels]
{channel}=Channel {channel}
[initial-channel-tokens]
{channel}={channel}-secret-token
[initial-producers]
{channel}-p=Producer
[initial-producer-tokens]
{channel}-p={channel}-producer-secret
"""


@pytest.mark.django_db
def test_status_shows_what_this_process_applied():
    plan = seed_parse(SEED.format(channel="alpha"))
    seed_apply(plan)
    body = APIClient().get("/_status").json()
    assert body["SeedApplied"] is True and body["SeedHash"] == plan.digest() and body["AppStatus"] == 3
    assert body["SeedAppliedAt"].endswith("Z") and "SeedData" not in body
    admin = APIClient().get("/_status", HTTP_X_BROKER_ADMIN_TOKEN=ADMIN_TOKEN).json()
    assert list(admin["SeedData"]["channels"]) == ["alpha"]
    assert "secret" not in str(admin), "no tokens"


@pytest.mark.django_db(transaction=True)
def test_two_brokers_on_one_database_each_show_their_own_seed(tmp_path):
    seeds = {}
    for name in ("staging", "dev"):
        path = tmp_path / f"{name}.cfg"
        path.write_text(SEED.format(channel=name))
        seeds[name] = (path, seed_parse(path.read_text()).digest())
    assert seeds["staging"][1] != seeds["dev"][1]
    staging = start_web(tmp_path, workers=2, BROKER_SEED_CONFIG=seeds["staging"][0])
    dev = start_web(tmp_path, workers=1, BROKER_SEED_CONFIG=seeds["dev"][0])
    try:
        for web, name in ((staging, "staging"), (dev, "dev")):
            # several requests: every worker of an instance answers its master's seed
            answers = {requests.get(f"{web.url}/_status", timeout=10).json()["SeedHash"] for _ in range(8)}
            assert answers == {seeds[name][1]}, name
        from broker.models import SeedState

        assert SeedState.objects.get().data_hash == seeds["dev"][1], "the database row only knows the last one"
        without = start_web(tmp_path)
        try:
            body = requests.get(f"{without.url}/_status", timeout=10).json()
            assert body["SeedApplied"] is False and body["SeedHash"] == "" and body["AppStatus"] == 3
        finally:
            without.stop()
    finally:
        staging.stop()
        dev.stop()
