"""Seed configuration (webhook-broker INI): parsing, invalid entries, idempotency, command."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command

from broker.models import Channel, Producer, SeedState
from consumers.models import Consumer
from consumers.seed import seed_apply, seed_parse

INI = """
[initial-channels]
orders=Orders Channel
untokened=No Token

[initial-producers]
shop=Shop

[initial-consumers]
mailer=http://127.0.0.1:9000/mailer
puller=
broken=http://127.0.0.1:9000/broken
lost=http://127.0.0.1:9000/lost
relative=/not-absolute

[initial-channel-tokens]
orders=orders-token

[initial-producer-tokens]
shop=shop-token

[mailer]
token=mailer-token
channel=orders
type=
maxInFlight=4

[puller]
token=puller-token
channel=orders
type=pull

[broken]
token=broken-token
channel=orders
type=wrongType

[lost]
token=lost-token
channel=nowhere

[relative]
token=r
channel=orders
"""


def test_parse_collects_entries_and_errors():
    plan = seed_parse(INI)
    assert plan.channels == {"orders": {"name": "Orders Channel", "token": "orders-token"}}
    assert plan.producers == {"shop": {"name": "Shop", "token": "shop-token"}}
    assert set(plan.consumers) == {"mailer", "puller"}
    assert plan.consumers["mailer"]["type"] == "push" and plan.consumers["mailer"]["max_in_flight"] == 4
    assert plan.consumers["puller"]["type"] == "pull" and plan.consumers["puller"]["callback_url"] == ""
    errors = "\n".join(plan.errors)
    assert "broken: invalid type 'wrongType'" in errors
    assert "lost: channel 'nowhere'" in errors
    assert "relative: callback URL" in errors
    assert "untokened: no token" in errors


def test_parse_bad_ini_does_not_raise():
    plan = seed_parse("[initial-channels\nx")
    assert plan.errors and not plan.channels


@pytest.mark.django_db
def test_apply_is_idempotent_and_logs_skips(caplog):
    plan = seed_parse(INI)
    with caplog.at_level(logging.ERROR):
        first = seed_apply(plan)
    assert first == {"channels": 1, "producers": 1, "consumers": 2}
    assert any("wrongType" in r.getMessage() for r in caplog.records)
    mailer = Consumer.objects.get(consumer_id="mailer")
    stamp = mailer.updated_at
    second = seed_apply(seed_parse(INI))
    assert second == {"channels": 0, "producers": 0, "consumers": 0}
    mailer.refresh_from_db()
    assert mailer.updated_at == stamp, "re-applying the same seed changes nothing"
    assert Channel.objects.count() == 1 and Producer.objects.count() == 1 and Consumer.objects.count() == 2
    assert not Consumer.objects.filter(consumer_id="broken").exists()
    assert mailer.signing_secret.startswith("whsec_")
    state = SeedState.objects.get()
    assert state.data_hash == plan.digest()
    assert "orders-token" not in str(state.data), "tokens are not kept in the seed record"


@pytest.mark.django_db
def test_seed_changes_are_applied(tmp_path):
    seed_apply(seed_parse(INI))
    changed = INI.replace("mailer-token", "new-mailer-token").replace("Orders Channel", "Orders!")
    seed_apply(seed_parse(changed))
    assert Consumer.objects.get(consumer_id="mailer").token == "new-mailer-token"
    assert Channel.objects.get(channel_id="orders").name == "Orders!"


@pytest.mark.django_db
def test_seed_command_and_example_file(capsys, api):
    call_command("seed", config="broker.example.cfg")
    out = capsys.readouterr().out
    assert "seeded 1 channels, 1 producers, 2 consumers" in out
    assert Consumer.objects.get(consumer_id="sample-pull-consumer").type == "pull"
    assert api.get("/_status").json()["SeedApplied"] is True
