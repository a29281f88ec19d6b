"""``manage.py broker_export`` writes the registry as a seed INI that ``seed`` reads back
identically: export, empty the registry, seed the file, export again, equal. Secrets only with
``--with-secrets``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from broker.models import Channel, Producer
from consumers.models import Consumer

pytestmark = pytest.mark.django_db


def _export(*args) -> str:
    out = io.StringIO()
    call_command("broker_export", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def registry(make, api):
    """Channels, producers and consumers with every kind of setting set away from its default."""
    assert api.put("/channel/orders", {"token": "orders-token", "name": "ORDERS", "retention": "3d",
                                       "messageTTL": "3600"}).status_code == 200
    make.channel("audit", token="audit-token")
    assert api.put("/producer/shop", {"token": "shop-token", "rateLimitPerSecond": "12.5",
                                      "burst": "40"}).status_code == 200
    make.producer("billing", token="billing-token")
    make.consumer("mailer", channel="orders", token="mailer-token", callback="http://127.0.0.1:9/mail",
                  name="Mailer", maxInFlight="4", maxDeliveriesPerSecond="2.5", connectionTimeout="4",
                  maxRetry="3", retryBackoff="1,5,30", messageTypes="order.*,invoice.paid",
                  filter='{"body": {"order.total": {"$gte": 100}}, "headers": {"X-Tenant": "acme"}}',
                  circuitBreakerFailures="7", circuitBreakerProbeSeconds="15",
                  circuitBreakerOpenAfterSeconds="3", maxAckPending="50")
    assert api.post("/channel/orders/consumer/mailer/pause").status_code in (200, 204)
    make.consumer("puller", channel="orders", token="puller-token", type="pull", callback=None,
                  priorityPolicy="overflow", priorityGroups="g1", priorityTimeout="30", maxQueued="500",
                  maxAckPending="20", notifyInterval="2", ordered="true")
    make.consumer("auditor", channel="audit", token="auditor-token", type="pull", callback=None)


def test_export_seed_export_round_trip(registry, tmp_path):
    first = _export("--with-secrets")
    public = _export()
    path = tmp_path / "registry.ini"
    call_command("broker_export", "--with-secrets", "--output", str(path))
    assert path.read_text() == first and oct(path.stat().st_mode & 0o777) == "0o600"
    before = {c.consumer_id: c.signing_secret for c in Consumer.objects.all()}

    Consumer.objects.all().delete()
    Channel.objects.all().delete()
    Producer.objects.all().delete()
    out = io.StringIO()
    call_command("seed", config=str(path), stdout=out, stderr=io.StringIO())
    assert "seeded 2 channels, 2 producers, 3 consumers (new: 2/2/3)" in out.getvalue()

    assert _export("--with-secrets") == first
    assert _export() == public
    assert {c.consumer_id: c.signing_secret for c in Consumer.objects.all()} == before
    mailer = Consumer.objects.get(consumer_id="mailer")
    assert mailer.paused and mailer.retry_backoff == "1,5,30" and mailer.filter["headers"] == {"x-tenant": "acme"}
    assert Consumer.objects.get(consumer_id="puller").priority_groups == ["g1"]
    orders = Channel.objects.get(channel_id="orders")
    assert (orders.retention, orders.message_ttl) == (3 * 86400, 3600)


def test_secrets_only_with_the_flag(registry):
    public = _export()
    for secret in ("orders-token", "shop-token", "mailer-token", "puller-token", "whsec_"):
        assert secret not in public
    assert "[initial-channel-tokens]\naudit=\norders=\n" in public
    full = _export("--with-secrets")
    assert "orders=orders-token" in full and "signingSecret=whsec_" in full
    for key in ("retryBackoff=1,5,30", "priorityPolicy=overflow", "priorityGroups=g1", "maxQueued=500",
                "paused=true", "ordered=true", "connectionTimeout=4", "maxRetry=3", "shop=12.5,40",
                "orders=259200", "circuitBreakerOpenAfterSeconds=3", "messageTypes=order.*,invoice.paid"):
        assert key in full, key


def test_a_partial_export_fails_unless_allowed(registry, make, tmp_path):
    """A consumer id on two channels is written once (the seed format names consumers by id): the
    file is still written, the command says what it left out and exits non-zero (``CommandError``:
    exit 1 from manage.py), unless ``--allow-partial``. A complete export says nothing and passes."""
    err = io.StringIO()
    call_command("broker_export", stdout=io.StringIO(), stderr=err)
    assert err.getvalue() == ""
    make.consumer("auditor", channel="orders", token="twin-token", type="pull", callback=None)
    path, err = tmp_path / "registry.ini", io.StringIO()
    with pytest.raises(CommandError, match="partial export: 1 left out"):
        call_command("broker_export", "--output", str(path), stdout=io.StringIO(), stderr=err)
    assert "left out: consumer auditor of channel orders" in err.getvalue()
    assert "[auditor]\ntoken=\nchannel=audit\n" in path.read_text()  # what could be written was
    err = io.StringIO()
    call_command("broker_export", "--allow-partial", stdout=io.StringIO(), stderr=err)
    assert "left out: consumer auditor of channel orders" in err.getvalue()
