"""Circuit breaker for push consumers (issue 17 part 4) against a real receiver on 127.0.0.1: a
circuit that opens (the endpoint answers 503), probes without spending retries, and closes when the
endpoint recovers; GET Circuit, /metrics, advisories, "close now"; and the pure rules."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from consumers.models import Circuit, CircuitState, Consumer
from jobs.models import DeliveryAttempt, Job, JobStatus
from jobs.push.circuit import CircuitTally, attempt_failed, circuit_tallies
from tests.jobs.conftest import Reply

THRESHOLD = 3
PROBE = 1.0


def circuit(api, consumer="c1"):
    return api.get(f"/channel/ch1/consumer/{consumer}").json()["Circuit"]


def gauge(api, consumer="c1") -> str:
    text = api.get("/metrics").content.decode()
    [line] = [x for x in text.splitlines()
              if x.startswith("broker_consumer_circuit_open{") and f'consumer="{consumer}"' in x]
    return line.rsplit(" ", 1)[1]


def advisories(api, consumer="c1") -> list[str]:
    return [a["type"] for a in api.get(f"/channel/ch1/consumer/{consumer}/advisories").json()["Result"]]


@pytest.fixture
def failing(make, receiver):
    """c1 -> /cb answering 503, threshold 3, a probe every second, 30 jobs queued."""
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), circuitBreakerFailures=str(THRESHOLD),
                  circuitBreakerProbeSeconds=str(PROBE), maxInFlight="3", retryBackoff="0.2", maxRetry="50",
                  circuitBreakerOpenAfterSeconds="0")  # on the failures alone (issue 17's rule)
    receiver.behave("/cb", lambda n, req: Reply(503))
    for i in range(30):
        assert make.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}").status_code == 201
    return make


@pytest.mark.django_db(transaction=True)
def test_circuit_opens_probes_without_spending_retries_and_closes(failing, receiver, dispatcher, api):
    assert circuit(api) == {"State": "CLOSED", "Since": circuit(api)["Since"], "Failures": 0}
    assert gauge(api) == "0.0"
    started = time.monotonic()
    dispatcher()
    receiver.wait(lambda: circuit(api)["State"] in ("OPEN", "HALF_OPEN"), what="the circuit to open")
    assert "circuit_opened" in advisories(api)
    assert gauge(api) == "1.0"
    time.sleep(3.5)
    # while open: at most the threshold, then one probe per interval
    elapsed = time.monotonic() - started
    got = len(receiver.at("/cb"))
    assert THRESHOLD < got <= THRESHOLD + int(elapsed / PROBE) + 1, (got, elapsed)
    # nothing died, and the probes spent no retry: only the first THRESHOLD attempts count
    jobs = Job.objects.filter(consumer__consumer_id="c1")
    assert jobs.filter(status=JobStatus.DEAD).count() == 0
    assert sum(j.retry_count for j in jobs) == THRESHOLD
    assert DeliveryAttempt.objects.filter(job_id__in=[j.pk for j in jobs]).count() == got
    state = circuit(api)
    assert state["State"] in ("OPEN", "HALF_OPEN") and state["Failures"] > THRESHOLD  # the failed probes count
    assert advisories(api) == ["circuit_opened"]
    # the endpoint recovers: the next probe closes the circuit and everything is delivered
    receiver.behave("/cb", lambda n, req: Reply(204))
    receiver.wait(lambda: circuit(api)["State"] == "CLOSED", timeout=10, what="the circuit to close")
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 30, what="30 deliveries")
    assert circuit(api)["Failures"] == 0 and gauge(api) == "0.0"
    assert advisories(api) == ["circuit_opened", "circuit_closed"]  # once per outage, not per failed probe


@pytest.mark.django_db(transaction=True)
def test_close_now_resumes_delivery_at_once(make, receiver, dispatcher, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), circuitBreakerFailures="2", circuitBreakerProbeSeconds="600",
                  maxInFlight="2", retryBackoff="0.1", maxRetry="50", circuitBreakerOpenAfterSeconds="0")
    healthy = {"on": False}
    receiver.behave("/cb", lambda n, req: Reply(204 if healthy["on"] else 500))
    for i in range(5):
        make.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}")
    dispatcher()
    receiver.wait(lambda: circuit(api)["State"] == "OPEN", what="the circuit to open")
    time.sleep(1.0)
    assert len(receiver.at("/cb")) == 2  # a probe only after 600 s
    healthy["on"] = True
    assert api.post("/channel/ch1/consumer/c1/circuit/close").json()["Circuit"]["State"] == "CLOSED"
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 5, what="5 deliveries")
    assert advisories(api) == ["circuit_opened", "circuit_closed"]


@pytest.mark.django_db(transaction=True)
def test_breaker_off_and_4xx_do_not_open(make, receiver, dispatcher, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), circuitBreakerFailures="0", retryBackoff="0.1", maxRetry="2")
    make.consumer("c3", token="c3-token", callback=receiver.url("/c3"), circuitBreakerFailures="1", maxRetry="0")
    receiver.behave("/cb", lambda n, req: Reply(503))
    receiver.behave("/c3", lambda n, req: Reply(400))
    for i in range(4):
        make.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}")
    dispatcher()
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DEAD).count() == 8, what="every job dead")
    assert len(receiver.at("/cb")) == 12  # off: every retry goes out (3 attempts x 4 jobs)
    assert circuit(api, "c1")["State"] == "CLOSED"
    assert circuit(api, "c3") == {**circuit(api, "c3"), "State": "CLOSED", "Failures": 0}  # 400s never count


@pytest.mark.django_db
def test_consumer_fields_put_and_get(make, api):
    make.channel()
    body = make.consumer("c1")
    assert (body["CircuitBreakerFailures"], body["CircuitBreakerProbeSeconds"]) == (10, 30.0)
    since = api.get("/channel/ch1/consumer/c1")["Last-Modified"]
    body = api.put("/channel/ch1/consumer/c1", {"circuitBreakerFailures": "0", "circuitBreakerProbeSeconds": "2.5"},
                   HTTP_IF_UNMODIFIED_SINCE=since).json()
    assert (body["CircuitBreakerFailures"], body["CircuitBreakerProbeSeconds"]) == (0, 2.5)
    got = api.get("/channel/ch1/consumer/c1").json()
    assert got["CircuitBreakerFailures"] == 0 and got["Circuit"]["State"] == "CLOSED"
    for field, value in (("circuitBreakerFailures", "-1"), ("circuitBreakerFailures", "x"),
                         ("circuitBreakerProbeSeconds", "0")):
        r = api.put("/channel/ch1/consumer/c2", {"token": "c-token", "callbackUrl": "http://127.0.0.1:9/cb",
                                                  field: value})
        assert r.status_code == 400 and r.json()["error"] == f"invalid_{field}"
    anon = APIClient()
    assert anon.post("/channel/ch1/consumer/c1/circuit/close").status_code == 401
    assert anon.post("/channel/ch1/consumer/c1/circuit/close", HTTP_X_BROKER_ADMIN_TOKEN="bad").status_code == 403


# --- the pure rules (no database) ---------------------------------------------------------------

@pytest.mark.parametrize(("outcome", "code", "failed"), [
    ("delivered", 200, False), ("delivered", 204, False), ("failed", 500, True), ("failed", 503, True),
    ("failed", 408, True), ("failed", 429, True), ("failed", 400, False), ("failed", 404, False),
    ("gone", 410, False), ("failed", 302, False), ("timeout", None, True), ("error", None, True),
    ("failed", 200, False),  # a 2xx whose handler reported an error: the endpoint is up
])
def test_which_attempts_count(outcome, code, failed):
    assert attempt_failed(outcome=outcome, status_code=code) is failed


def test_tallies_count_failures_after_the_last_success():
    got = circuit_tallies([(1, True, False, 0.1), (2, True, False, 0.1), (1, False, False, 0.1), (1, True, False, 0.1),
                           (2, True, False, 0.1), (1, True, False, 0.1)])
    assert got == [CircuitTally(consumer_pk=1, ok=True, fails=2, since=0.1),
                   CircuitTally(consumer_pk=2, ok=False, fails=2, since=0.1)]


def test_tallies_date_a_run_of_failures_from_its_oldest_attempt():
    """A timeout has been failing since its attempt began: the run's age is its oldest attempt's,
    and a success starts it over."""
    got = circuit_tallies([(1, True, False, 30.0), (1, True, False, 29.5), (2, True, False, 30.0),
                           (2, False, False, 0.01), (2, True, False, 0.02)])
    assert got == [CircuitTally(consumer_pk=1, ok=False, fails=2, since=30.0),
                   CircuitTally(consumer_pk=2, ok=True, fails=1, since=0.02)]


def test_tallies_leave_out_healthy_consumers_unless_their_circuit_was_counting():
    got = circuit_tallies([(1, False, False, 0.1), (1, False, False, 0.1), (2, False, True, 0.1), (3, True, False, 0.1),
                           (3, False, False, 0.1)])
    assert got == [CircuitTally(consumer_pk=2, ok=True, fails=0), CircuitTally(consumer_pk=3, ok=True, fails=0)]


@pytest.mark.django_db
def test_admin_shows_the_circuit_and_closes_it(make, api, admin_client):
    make.channel()
    make.consumer("c1")
    consumer = Consumer.objects.get(consumer_id="c1")
    Circuit.objects.create(consumer=consumer, state=CircuitState.OPEN, since=timezone.now(), failures=12)
    assert gauge(api) == "1.0" and circuit(api)["State"] == "OPEN" and circuit(api)["Failures"] == 12
    page = admin_client.get(f"/admin/consumers/consumer/{consumer.pk}/change/").content.decode()
    assert "OPEN since" in page and "12 consecutive failures" in page and "consumer-circuit-close" in page
    r = admin_client.post(f"/admin/consumers/consumer/{consumer.pk}/circuit-close/", follow=True)
    assert [str(m) for m in r.context["messages"]] == ["Closed the circuit of ch1/c1."]
    assert circuit(api)["State"] == "CLOSED" and circuit(api)["Failures"] == 0 and gauge(api) == "0.0"
    assert advisories(api) == ["circuit_closed"]
    r = admin_client.post("/admin/consumers/consumer/", {"action": "circuit_close", "_selected_action": [consumer.pk]},
                          follow=True)
    assert [str(m) for m in r.context["messages"]] == ["No open or failing circuit among the selected consumers."]


@pytest.mark.django_db(transaction=True)
def test_a_success_ends_a_run_of_failures(make, receiver, dispatcher, api):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/cb"), circuitBreakerFailures="5", maxInFlight="1",
                  retryBackoff="0.1")
    receiver.behave("/cb", lambda n, req: Reply(503 if n <= 2 else 204))
    dispatcher()
    make.publish(HTTP_X_BROKER_MESSAGE_ID="m0")
    receiver.wait(lambda: len(receiver.at("/cb")) == 2, what="two failed attempts")
    receiver.wait(lambda: circuit(api)["Failures"] == 2, what="two failures counted")
    for i in range(1, 4):
        make.publish(HTTP_X_BROKER_MESSAGE_ID=f"m{i}")
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 4, what="4 deliveries")
    receiver.wait(lambda: circuit(api)["Failures"] == 0, what="the count reset")
    assert circuit(api)["State"] == "CLOSED" and advisories(api) == []
