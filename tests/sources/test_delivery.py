"""Sources through the real group commit (outside a test transaction): the push consumer gets the
provider's event with X-Broker-Source and X-Broker-Source-Delivery, concurrent copies of one
delivery store one message, the tally thread writes the counts, and the housekeeping step prunes
expired dedupe rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest
from django.db import connection
from rest_framework.test import APIClient

from broker.models import Message
from jobs.housekeeping import STEPS, housekeeping_run
from jobs.publish.grouped import _publisher
from sources.models import Source, SourceDelivery
from sources.prune import source_deliveries_prune
from sources.tallies import source_counts, source_tallies_flush
from tests.sources.conftest import GITHUB_SECRET, github_headers, meta

pytestmark = pytest.mark.django_db(transaction=True)


def post(source_id: str, body: bytes, headers: dict) -> int:
    try:
        return APIClient().generic("POST", f"/in/{source_id}", body, content_type="application/json",
                                   **meta(headers)).status_code
    finally:
        connection.close()


def test_the_push_consumer_gets_the_event_with_its_source(push_world, api, receiver, dispatcher):
    r = api.put("/channel/ch1/source/gh", {"verify": "github", "secret": GITHUB_SECRET}, format="json")
    assert r.status_code == 201
    body = b'{"action": "opened", "number": 7}'
    assert post(r.json()["ID"], body, github_headers(body, delivery="del-7", event="pull_request")) == 200
    dispatcher()
    receiver.wait(lambda: receiver.at("/cb"), what="the push delivery")
    [delivered] = receiver.at("/cb")
    assert delivered.body == body and delivered.headers["content-type"] == "application/json"
    assert delivered.headers["x-broker-source"] == "gh"
    assert delivered.headers["x-broker-source-delivery"] == "del-7"
    assert delivered.headers["x-broker-message-type"] == "pull_request"
    assert "webhook-signature" in delivered.headers  # the broker's own signature to its consumer


def test_concurrent_copies_of_one_delivery_store_one_message(world, api, settings):
    settings.BROKER_PUBLISH_ADMIT_WAIT = 0  # (admission would refuse the last of a burst on a busy machine: not tested here)
    r = api.put("/channel/ch1/source/gh", {"verify": "github", "secret": GITHUB_SECRET}, format="json")
    source_id = r.json()["ID"]
    batches = _publisher.batches
    bodies = [(f'{{"n": {i}}}'.encode(), f"d-{i // 4}") for i in range(48)]  # 12 deliveries, 4 copies each
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda item: post(source_id, item[0], github_headers(item[0], delivery=item[1])),
                                 bodies))
    assert statuses == [200] * 48
    assert Message.objects.count() == 12
    assert sorted(Message.objects.values_list("headers__X-Broker-Source-Delivery", flat=True)) == sorted(
        f"d-{i}" for i in range(12))
    assert _publisher.batches > batches  # through the group commit's thread
    source_tallies_flush()
    pk = Source.objects.get(source_id=source_id).pk
    assert source_counts(source_pks=[pk])[pk] == {"accepted": 12, "duplicate": 36}


def test_the_housekeeping_step_prunes_expired_rows(world, api):
    assert "source_deliveries_pruned" in {step.key for step in STEPS}
    r = api.put("/channel/ch1/source/gh", {"verify": "github", "secret": GITHUB_SECRET}, format="json")
    for i in range(5):
        assert post(r.json()["ID"], b"{}", github_headers(b"{}", delivery=f"d-{i}")) == 200
    SourceDelivery.objects.filter(key__in=list(SourceDelivery.objects.values_list("key", flat=True)[:3])).update(
        expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert housekeeping_run()["source_deliveries_pruned"] == 3
    assert SourceDelivery.objects.count() == 2 and source_deliveries_prune() == 0
