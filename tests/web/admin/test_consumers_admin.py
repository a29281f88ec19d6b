"""Consumers in the admin: statistics, masked credentials, edits through the consumer service
(with optimistic concurrency), secret rotation, dead-job requeue and purge, delete."""

from __future__ import annotations

import re

import pytest
from django.utils.http import http_date

from consumers.models import Consumer
from jobs.models import Job, JobStatus
from tests.helpers import admin_form_data
from tests.web.admin.conftest import consumer_pk, dead_ids

pytestmark = pytest.mark.django_db

URL = "/admin/consumers/consumer/"
LONG_TOKEN = "consumer-token-abcdefghijklmnopWXYZ"


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_list_shows_counts_and_masked_tokens(admin_client, broker, make):
    make.consumer("c3", token=LONG_TOKEN)
    r = admin_client.get(URL)
    html = r.content.decode()
    assert r.status_code == 200
    assert LONG_TOKEN not in html and "\u2022\u2022\u2022\u2022WXYZ" in html
    assert "c-token" not in html  # short tokens show no characters at all
    c1 = next(c for c in r.context["cl"].result_list if c.consumer_id == "c1")
    assert (c1.n_queued, c1.n_inflight, c1.n_delivered, c1.n_dead) == (4, 1, 3, 2)
    assert f"consumer={consumer_pk('c1')}&amp;status__exact=1004" in html


def test_change_page_shows_statistics_and_never_the_secrets(admin_client, broker):
    consumer = Consumer.objects.get(consumer_id="c1")
    html = admin_client.get(f"{URL}{consumer.pk}/change/").content.decode()
    assert consumer.signing_secret not in html and consumer.token not in html
    assert "pulls waiting now" in html and "Attempts per minute" in html
    assert 'id="consumer-rotate-secret"' in html and 'id="consumer-requeue-dead"' in html


def test_edit_goes_through_the_service(admin_client, broker, api):
    consumer = Consumer.objects.get(consumer_id="c1")
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    data = admin_form_data(r, callback_url="http://127.0.0.1:9/new", max_in_flight="3", retry_backoff="1, 2,3",
                     new_token=LONG_TOKEN)
    r = admin_client.post(f"{URL}{consumer.pk}/change/", data, follow=True)
    assert r.status_code == 200, r.content
    consumer.refresh_from_db()
    assert (consumer.callback_url, consumer.max_in_flight, consumer.retry_backoff, consumer.token) == (
        "http://127.0.0.1:9/new", 3, "1,2,3", LONG_TOKEN)
    # the API sees it, and the row's Last-Modified moved on (the service bumps it)
    body = api.get("/channel/ch1/consumer/c1").json()
    assert body["CallbackURL"] == "http://127.0.0.1:9/new" and body["MaxInFlight"] == 3


def test_a_stale_form_is_refused(admin_client, broker, api):
    consumer = Consumer.objects.get(consumer_id="c1")
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    stale = admin_form_data(r, name="from the admin")
    # someone changes the consumer through the API meanwhile
    changed = api.put("/channel/ch1/consumer/c1", {"name": "from the api"},
                      HTTP_IF_UNMODIFIED_SINCE=http_date(consumer.updated_at.timestamp()))
    assert changed.status_code == 200
    r = admin_client.post(f"{URL}{consumer.pk}/change/", stale, follow=True)
    assert any("changed by someone else" in m for m in messages_of(r))
    consumer.refresh_from_db()
    assert consumer.name == "from the api"


def test_invalid_settings_are_form_errors(admin_client, broker):
    consumer = Consumer.objects.get(consumer_id="c1")
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    r = admin_client.post(f"{URL}{consumer.pk}/change/",
                          admin_form_data(r, callback_url="ftp://x", retry_backoff="a,b", connection_timeout="-1"))
    assert r.status_code == 200
    errors = r.context["adminform"].form.errors
    assert set(errors) >= {"callback_url", "retry_backoff", "connection_timeout"}


def test_add_consumer(admin_client, broker):
    channel = Consumer.objects.get(consumer_id="c1").channel
    r = admin_client.post(f"{URL}add/", {"channel": channel.pk, "consumer_id": "new", "name": "", "type": "pull",
                                         "callback_url": "", "max_in_flight": "10", "new_token": ""}, follow=True)
    assert r.status_code == 200, r.content
    created = Consumer.objects.get(consumer_id="new")
    assert created.type == "pull" and created.name == "new"
    assert len(created.token) >= 16 and created.signing_secret.startswith("whsec_")
    # a push consumer needs a callback
    r = admin_client.post(f"{URL}add/", {"channel": channel.pk, "consumer_id": "p", "type": "push",
                                         "callback_url": "", "max_in_flight": "10"})
    assert "callback_url" in r.context["adminform"].form.errors


def test_rotate_secret_shows_the_new_secret_once(admin_client, broker):
    consumer = Consumer.objects.get(consumer_id="c1")
    old = consumer.signing_secret
    assert admin_client.get(f"{URL}{consumer.pk}/rotate-secret/").status_code == 405
    r = admin_client.post(f"{URL}{consumer.pk}/rotate-secret/")
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    consumer.refresh_from_db()
    assert consumer.signing_secret != old and consumer.previous_signing_secret == old
    assert consumer.previous_secret_expires_at is not None
    html = r.content.decode()
    assert consumer.signing_secret in html
    assert not messages_of(admin_client.get(f"{URL}{consumer.pk}/change/"))  # not kept in a message
    assert consumer.signing_secret not in admin_client.get(f"{URL}{consumer.pk}/change/").content.decode()


def test_rotate_secret_action_for_several(admin_client, broker):
    pks = list(Consumer.objects.values_list("pk", flat=True))
    before = dict(Consumer.objects.values_list("pk", "signing_secret"))
    r = admin_client.post(URL, {"action": "rotate_secret", "_selected_action": pks})
    html = r.content.decode()
    for c in Consumer.objects.all():
        assert c.signing_secret != before[c.pk] and c.signing_secret in html


def test_requeue_dead_button_and_action(admin_client, broker):
    pk = consumer_pk("c1")
    r = admin_client.post(f"{URL}{pk}/requeue-dead/", follow=True)
    assert "Requeued 2 dead jobs: 2 of ch1/c1." in messages_of(r)
    assert not Job.objects.filter(status=JobStatus.DEAD).exists()
    r = admin_client.post(URL, {"action": "requeue_dead", "_selected_action": [pk]}, follow=True)
    assert "Requeued 0 dead jobs." in messages_of(r)


def test_delete_all_dead_asks_first(admin_client, broker):
    pk = consumer_pk("c1")
    r = admin_client.post(URL, {"action": "delete_all_dead", "_selected_action": [pk]})
    assert r.status_code == 200 and "ch1 / c1: 2 dead jobs" in r.content.decode()
    assert len(dead_ids()) == 2
    r = admin_client.post(URL, {"action": "delete_all_dead", "_selected_action": [pk], "post": "yes"}, follow=True)
    assert "Deleted 2 dead jobs." in messages_of(r)
    assert dead_ids() == []


def test_delete_consumer_uses_counters_and_the_service(admin_client, broker):
    pk = consumer_pk("c1")
    r = admin_client.get(f"{URL}{pk}/delete/")
    html = r.content.decode()
    assert r.status_code == 200 and "10 jobs of it" in html
    r = admin_client.post(f"{URL}{pk}/delete/", {"post": "yes"}, follow=True)
    assert r.status_code == 200
    assert not Consumer.objects.filter(pk=pk).exists() and not Job.objects.filter(consumer_id=pk).exists()


def test_consumer_page_links_to_its_jobs(admin_client, broker):
    html = admin_client.get(f"{URL}{consumer_pk('c1')}/change/").content.decode()
    links = re.findall(r'href="(/admin/jobs/job/\?[^"]+)"', html)
    assert any("status__exact=1004" in link for link in links)


def test_message_types_field_edits_the_filters(admin_client, broker, api):
    """Filters (issue 17): the "Message types" field shows and takes the patterns as the API does."""
    consumer = Consumer.objects.get(consumer_id="c1")
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    assert r.context["adminform"].form.initial["message_types"] == ""
    r = admin_client.post(f"{URL}{consumer.pk}/change/", admin_form_data(r, message_types="order.*, invoice.paid"),
                          follow=True)
    assert r.status_code == 200
    consumer.refresh_from_db()
    assert consumer.message_types == ["order.*", "invoice.paid"]
    assert api.get("/channel/ch1/consumer/c1").json()["MessageTypes"] == "order.*,invoice.paid"
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    assert r.context["adminform"].form.initial["message_types"] == "order.*,invoice.paid"
    r = admin_client.post(f"{URL}{consumer.pk}/change/", admin_form_data(r, message_types="order**"))
    assert "message_types" in r.context["adminform"].form.errors
    consumer.refresh_from_db()
    assert consumer.message_types == ["order.*", "invoice.paid"]
