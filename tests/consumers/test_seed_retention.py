"""Retention from the INI seed with a database: the channel's retention applied and shown by the
GET, and ``[prune] message-retention-days`` becoming BROKER_RETENTION at start-up (unless the
environment sets it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker.models import Channel
from consumers.seed import seed_apply, seed_parse
from tests.processes import ROOT

pytestmark = pytest.mark.django_db

INI = """
[initial-channels]
orders = Orders
[initial-channel-tokens]
orders = orders-token
[initial-channel-retention]
orders = 15m
[prune]
message-retention-days = 3
"""


def test_seeded_channel_retention(api):
    seed_apply(seed_parse(INI))
    assert Channel.objects.get(channel_id="orders").retention == 900
    body = api.get("/channel/orders").json()
    assert body["Retention"] == "15m" and body["Footprint"]["Retention"] == "15m"
    seed_apply(seed_parse(INI.replace("orders = 15m", "orders =")))  # emptied: the broker's default
    assert Channel.objects.get(channel_id="orders").retention is None


def _settings_retention(tmp_path, **env) -> str:
    seed = tmp_path / "seed.ini"
    seed.write_text(INI)
    code = ("import broker.settings as s; from broker.durations import duration_format as f; "
            "print(f(s.BROKER_RETENTION), f(s.BROKER_DEAD_RETENTION))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_RETENTION")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**clean, "BROKER_SEED_CONFIG": str(seed), "DJANGO_SECRET_KEY": "x", **env})
    return out.stdout.strip()


def test_prune_days_become_the_retention_setting(tmp_path):
    assert _settings_retention(tmp_path) == "3d 90d"
    assert _settings_retention(tmp_path, BROKER_RETENTION="90m", BROKER_DEAD_RETENTION="14d") == "90m 14d"
    bad = subprocess.run([sys.executable, "-c", "import broker.settings"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "DJANGO_SECRET_KEY": "x", "BROKER_RETENTION": "a week"})
    assert bad.returncode != 0 and "BROKER_RETENTION must be a duration" in bad.stderr
