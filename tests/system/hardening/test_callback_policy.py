"""Callback URL policy (BROKER_CALLBACK_DENY_PRIVATE / BROKER_CALLBACK_ALLOW): refused at registration
(consumer PUT, seed file) and again when the push client connects."""

from __future__ import annotations

import logging

import pytest

from broker import netpolicy
from consumers.models import Consumer
from consumers.seed import seed_apply, seed_parse
from jobs.models import DeliveryAttempt, Job, JobStatus
from tests.helpers import seed_one_channel

DENIED = [
    "http://127.0.0.1/x", "http://127.8.9.10:8080/x", "http://localhost:9/x", "http://10.0.0.1/",
    "http://172.16.5.4/", "http://192.168.1.1/", "http://100.64.0.1/", "http://169.254.169.254/latest/meta-data/",
    "http://224.0.0.1/", "http://239.255.255.250:1900/", "http://0.0.0.0/", "http://[::1]/", "http://[::]/",
    "http://[fe80::1]/", "http://[fc00::1]/", "http://[fd12:3456::1]/", "http://[ff02::1]/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:169.254.169.254]/", "http://[::ffff:a00:1]/",
    "http://[2002:7f00:1::]/", "https://127.1/", "http://2130706433/", "http://0x7f000001/",
]
ALLOWED = ["http://93.184.216.34/hook", "https://[2606:2800:220:1:248:1893:25c8:1946]/hook", "http://8.8.8.8:8080/"]


@pytest.fixture
def deny(settings):
    settings.BROKER_CALLBACK_DENY_PRIVATE = True
    settings.BROKER_CALLBACK_ALLOW = ""
    return settings


def put_consumer(api, url, cid="c9"):
    return api.put(f"/channel/ch1/consumer/{cid}", {"token": "t", "callbackUrl": url})


@pytest.mark.django_db
def test_registration_refuses_internal_addresses(world, api, deny):
    for url in DENIED:
        r = put_consumer(api, url)
        assert r.status_code == 400, (url, r.content)
        assert r.json()["error"] == "callback_url_not_allowed", url
    assert not Consumer.objects.filter(consumer_id="c9").exists()
    for i, url in enumerate(ALLOWED):
        assert put_consumer(api, url, f"ok{i}").status_code == 200, url
    # a pull consumer needs no callback, an unresolvable name is left to the delivery-time check
    assert api.put("/channel/ch1/consumer/p9", {"token": "t", "type": "pull"}).status_code == 200
    assert put_consumer(api, "http://no-such-host.invalid/x", "later").status_code == 200


@pytest.mark.django_db
def test_updating_to_an_internal_address_is_refused(world, api, deny):
    r = put_consumer(api, "http://93.184.216.34/hook")
    assert r.status_code == 200
    r = api.put("/channel/ch1/consumer/c9", {"callbackUrl": "http://169.254.169.254/"},
                HTTP_IF_UNMODIFIED_SINCE=r["Last-Modified"])
    assert r.status_code == 400 and r.json()["error"] == "callback_url_not_allowed"
    assert Consumer.objects.get(consumer_id="c9").callback_url == "http://93.184.216.34/hook"


@pytest.mark.django_db
def test_allow_list_and_switch(world, api, settings):
    settings.BROKER_CALLBACK_DENY_PRIVATE = True
    settings.BROKER_CALLBACK_ALLOW = "10.1.0.0/16, receiver.internal, ::1, 127.0.0.5"
    assert put_consumer(api, "http://10.1.2.3:8080/x", "a").status_code == 200
    assert put_consumer(api, "http://10.2.0.1/x", "b").status_code == 400
    assert put_consumer(api, "http://receiver.internal/x", "c").status_code == 200  # by name, unresolved
    assert put_consumer(api, "http://[::1]:9/x", "d").status_code == 200
    assert put_consumer(api, "http://[::ffff:127.0.0.5]/x", "e").status_code == 200  # mapped form of an allowed one
    assert put_consumer(api, "http://127.0.0.6/x", "f").status_code == 400
    settings.BROKER_CALLBACK_DENY_PRIVATE = False
    assert put_consumer(api, "http://169.254.169.254/", "g").status_code == 200


def test_address_classification(settings):
    settings.BROKER_CALLBACK_DENY_PRIVATE = True
    settings.BROKER_CALLBACK_ALLOW = ""
    for address in ("127.0.0.1", "10.9.9.9", "169.254.169.254", "fe80::1%eth0", "::ffff:192.168.0.1", "0.0.0.0",
                    "255.255.255.255", "198.18.0.1", "fec0::1", "not-an-address"):
        assert netpolicy.address_denied(address), address
    for address in ("1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"):
        assert not netpolicy.address_denied(address), address
    with pytest.raises(netpolicy.CallbackDenied):
        netpolicy.addresses_check("mixed.example", ["93.184.216.34", "10.0.0.1"])  # one bad answer is enough
    assert netpolicy.addresses_check("ok.example", ["93.184.216.34"]) == ["93.184.216.34"]


@pytest.mark.django_db
def test_seed_skips_denied_consumers(deny, caplog):
    plan = seed_parse(seed_one_channel("""
[initial-consumers]
metadata=http://169.254.169.254/latest
public=http://93.184.216.34/hook
[metadata]
token=t1
channel=ch
[public]
token=t2
channel=ch
"""))
    with caplog.at_level(logging.ERROR):
        seed_apply(plan)
    assert set(Consumer.objects.values_list("consumer_id", flat=True)) == {"public"}
    assert any("metadata" in r.getMessage() and "not allowed" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_delivery_rechecks_the_address_at_connect_time(make, receiver, dispatcher, settings):
    """Registered while its address was allowed, refused when the push client connects (what a DNS
    answer that changed after registration looks like): a failed attempt with a clear error."""
    settings.BROKER_CALLBACK_ALLOW = "127.0.0.1,::1"
    make.channel()
    make.producer()
    make.consumer("c1", callback=f"http://localhost:{receiver.port}/cb", maxRetry="0")  # resolves to loopback
    settings.BROKER_CALLBACK_ALLOW = ""  # from now on loopback is refused
    d = dispatcher()
    assert make.publish(body=b"x").status_code == 201
    receiver.wait(lambda: Job.objects.filter(consumer__consumer_id="c1", status=JobStatus.DEAD).exists(),
                  what="the refused job to end DEAD")
    attempt = DeliveryAttempt.objects.get(job_id=Job.objects.get(consumer__consumer_id="c1").pk)
    assert attempt.status_code is None and attempt.outcome == "error"
    assert "CallbackDenied" in attempt.error and "not allowed" in attempt.error, attempt.error
    assert receiver.at("/cb") == []
    assert d.error is None and d.thread.is_alive()
