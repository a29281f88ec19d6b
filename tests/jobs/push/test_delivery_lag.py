"""Admission by the push deliveries' lag, end to end (issue 34, "shed, don't drown"): a real
dispatcher claims jobs that waited, reports how long (jobs.push.lag, jobs_pushowner.lag), and the
web process's publishing thread reads the report and takes single publishes at a rate, refusing the rest with 503
``overloaded`` and Retry-After (jobs.publish.admission); once the report is gone, every publish is
taken again. What is refused is not stored; what is accepted is."""

from __future__ import annotations

import time

import pytest

from broker.models import Message
from jobs.models import PushOwner
from jobs.publish import admission
from jobs.push import lag
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_publishes_are_refused_in_part_while_deliveries_are_behind_and_taken_again_after(
        push_world, receiver, dispatcher, settings, monkeypatch, api):
    settings.BROKER_PUBLISH_ADMIT_LAG = 1.0
    monkeypatch.setattr(admission, "lag_admission", admission.LagAdmission())
    monkeypatch.setattr("jobs.publish.grouped.lag_admission", admission.lag_admission)
    for i in range(5):
        assert push_world.publish(body=b'{"n": %d}' % i).status_code == 201
    time.sleep(2.5)  # the jobs wait, due, with no dispatcher running: 2.5 s behind
    dispatcher(concurrency=64)  # room for all five in one claim: not held by the loop's share (jobs.push.lag)
    receiver.wait(lambda: len(receiver.at("/cb")) >= 5, what="the 5 callbacks")
    assert wait_for(lambda: PushOwner.objects.filter(lag__gte=2.0).exists(), timeout=10, interval=0.02), \
        list(PushOwner.objects.values("lag", "lag_at"))
    # no later report (the next, of a period without claims, would say 0): this one stays as written,
    # and counts for jobs.publish.admission.FRESH seconds
    monkeypatch.setattr(lag, "PERIOD", 3600.0)
    [gauge] = [line for line in api.get("/metrics").content.decode().splitlines()
               if line.startswith("broker_push_delivery_lag_seconds ")]
    assert float(gauge.split()[1]) >= 2.0, gauge  # operators see what admission decides from
    before = _refused(api)

    answers = [push_world.publish(body=b"{}", x_broker_message_id=f"behind-{i}") for i in range(40)]
    codes = [a.status_code for a in answers]
    refused = [a for a in answers if a.status_code == 503]
    # the first read cuts the rate to what was taken lately (nothing: RATE_MIN a second)
    assert len(refused) >= 20 and set(codes) <= {201, 503}, codes
    assert all(a.json()["error"] == "overloaded" and a["Retry-After"] == "1" for a in refused)
    stored = set(Message.objects.filter(message_id__startswith="behind-").values_list("message_id", flat=True))
    assert stored == {f"behind-{i}" for i, code in enumerate(codes) if code == 201}
    # operators see the refusals and why, every process's within a second (jobs.publish.refusals)
    expected = {**before, "delivery_lag": before["delivery_lag"] + len(refused)}
    assert wait_for(lambda: _refused(api) == expected, timeout=5, interval=0.1), (_refused(api), expected)

    time.sleep(admission.FRESH + 0.5)  # the stopped engine's report is no longer fresh
    answers = [push_world.publish(body=b"{}", x_broker_message_id=f"after-{i}") for i in range(20)]
    assert [a.status_code for a in answers] == [201] * 20
    assert admission.lag_admission.limit is None


def _refused(api) -> dict[str, float]:
    """``broker_publish_refused_total`` on /metrics, by reason."""
    prefix = 'broker_publish_refused_total{reason="'
    return {line[len(prefix):].split('"')[0]: float(line.split()[-1])
            for line in api.get("/metrics").content.decode().splitlines() if line.startswith(prefix)}
