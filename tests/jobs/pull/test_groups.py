"""Priority groups of pull consumers (issue 5): configuration, pull fields, overflow, pinned
client (423s, pin timer, unpin, advisories), prioritized. The behaviour tests run over real HTTP
against two gunicorn servers sharing the test database, so waiting pulls and pins must agree
across processes."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.jobs.pull.conftest import publish_n
from tests.processes import start_web

ADMIN = {"X-Broker-Admin-Token": ADMIN_TOKEN}
TOKENS = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "pt"}
PRODUCER = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "pr", "X-Broker-Producer-Token": "prt"}


# --- configuration and pull-field checks (in-process HTTP) --------------------------------------

def _put(api, cid, **data):
    return api.put(f"/channel/ch1/consumer/{cid}", {"token": "t", "type": "pull", **data}, format="json")


def _update(api, cid, **data):
    since = api.get(f"/channel/ch1/consumer/{cid}")["Last-Modified"]
    return api.put(f"/channel/ch1/consumer/{cid}", data, format="json", HTTP_IF_UNMODIFIED_SINCE=since)


@pytest.mark.django_db
def test_creation_errors_each_have_their_own_code(world, api):
    cases = [
        (dict(type="push", callbackUrl="http://127.0.0.1:9/cb", priorityPolicy="overflow", priorityGroups=["A"]),
         "priority_policy_on_push"),
        (dict(priorityPolicy="overflow"), "priority_group_required"),
        (dict(priorityPolicy="overflow", priorityGroups=[]), "priority_group_required"),
        (dict(priorityPolicy="pinned_client", priorityGroups=[""]), "priority_group_empty"),
        (dict(priorityPolicy="overflow", priorityGroups=["A B"]), "invalid_priority_group"),
        (dict(priorityPolicy="overflow", priorityGroups=["group-name-that-is-too-long"]), "invalid_priority_group"),
        (dict(priorityGroups=["A"]), "priority_groups_without_policy"),
        (dict(priorityPolicy="none", priorityTimeout=10), "priority_timeout_without_policy"),
        (dict(priorityPolicy="overflow", priorityGroups=["A", "B"]), "too_many_priority_groups"),
        (dict(priorityPolicy="sometimes", priorityGroups=["A"]), "invalid_priority_policy"),
        (dict(priorityPolicy="pinned_client", priorityGroups=["A"], priorityTimeout=-1), "invalid_priority_timeout"),
    ]
    codes = set()
    for i, (data, code) in enumerate(cases):
        r = _put(api, f"bad{i}", **data)
        assert r.status_code == 400, (data, r.content)
        assert r.json()["error"] == code, (data, r.json())
        codes.add(code)
    assert len(codes) == len({c for _, c in cases})

    r = _put(api, "pin", priorityPolicy="pinned_client", priorityGroups=["group/consumer=A"])
    assert r.status_code == 200, r.content
    body = api.get("/channel/ch1/consumer/pin").json()
    assert body["PriorityPolicy"] == "pinned_client"
    assert body["PriorityTimeout"] == 120
    assert body["PriorityGroups"] == [{"group": "group/consumer=A"}]
    assert "NumWaiting" in body
    # only priorityTimeout may change; the policy and the groups may not
    r = _update(api, "pin", priorityTimeout=30)
    assert r.status_code == 200 and r.json()["PriorityTimeout"] == 30
    r = _update(api, "pin", priorityPolicy="pinned_client", priorityGroups=["group/consumer=A"], name="same")
    assert r.status_code == 200, r.content
    assert _update(api, "pin", priorityPolicy="overflow").json()["error"] == "priority_policy_immutable"
    assert _update(api, "pin", priorityPolicy="none").json()["error"] == "priority_policy_immutable"
    r = _update(api, "pin", priorityPolicy="pinned_client", priorityGroups=["B"])
    assert r.json()["error"] == "priority_groups_immutable"
    assert _update(api, "pin", type="push", callbackUrl="http://127.0.0.1:9/cb").json()["error"] == \
        "priority_policy_on_push"
    assert _update(api, "c2", priorityPolicy="overflow", priorityGroups=["A"]).json()["error"] == \
        "priority_policy_immutable"
    # form fields work too
    r = api.put("/channel/ch1/consumer/form", {"token": "t", "type": "pull", "priorityPolicy": "overflow",
                                               "priorityGroups": "jobs"})
    assert r.status_code == 200 and r.json()["PriorityGroups"] == [{"group": "jobs"}]
    assert r.json()["PriorityTimeout"] is None


@pytest.mark.django_db
def test_pull_fields_are_checked_and_a_rejected_pull_is_never_served(world, api, client_anon, make):
    from tests.jobs.pull.conftest import PullClient, job_status

    _put(api, "ov", token="ovt", priorityPolicy="overflow", priorityGroups=["A"])
    _put(api, "pn", token="pnt", priorityPolicy="pinned_client", priorityGroups=["A"])
    publish_n(make, 3)
    plain = PullClient(client_anon)
    ov = PullClient(client_anon, "/channel/ch1/consumer/ov",
                    {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "ovt"})
    pn = PullClient(client_anon, "/channel/ch1/consumer/pn",
                    {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "pnt"})
    checks = [
        (plain.pull(min_pending=1), "not_overflow_consumer"),
        (pn.pull(group="A", min_ack_pending=1), "not_overflow_consumer"),
        (plain.pull(id="X"), "not_pinned_consumer"),
        (ov.pull(group="A", id="X"), "not_pinned_consumer"),
        (plain.pull(priority=10), "invalid_priority"),
        (ov.pull(group="A", priority=-1), "invalid_priority"),
        (ov.pull(expires=1), "group_missing"),
        (pn.pull(), "group_missing"),
        (pn.pull(group="Bad"), "invalid_group"),
        (plain.pull(group="A"), "invalid_group"),
    ]
    for r, code in checks:
        assert r.status_code == 400, r.content
        assert r.json()["error"] == code
    for client in (plain, ov, pn):
        stats = client.stats()
        assert stats["NumPending"] == 3 and stats["NumAckPending"] == 0 and stats["NumWaiting"] == 0
    assert "Priority Group missing" in pn.pull().json()["detail"]

    # the spec's per-job claim is refused on a consumer with a policy; acknowledging still works
    job_id = ov.queued().json()["Result"][0]["ID"]
    r = ov.set_state(job_id, {"NextState": "INFLIGHT"})
    assert r.status_code == 400 and r.json()["error"] == "group_missing"
    assert job_status(job_id) == ("QUEUED", 0)
    got = ov.pull(group="A", batch=2).json()["Result"]
    assert len(got) == 2
    assert ov.set_state(got[0]["ID"], {"NextState": "DELIVERED"}).status_code == 202
    assert ov.set_state(got[1]["ID"], {"NextState": "DEAD"}).status_code == 202
    assert ov.set_state(got[1]["ID"], {"NextState": "INFLIGHT"}).json()["error"] == "group_missing"
    # a consumer without a policy keeps the spec claim
    job_id = plain.queued().json()["Result"][0]["ID"]
    assert plain.set_state(job_id, {"NextState": "INFLIGHT"}).status_code == 202


# --- served: two gunicorn servers ----------------------------------------------------------------

@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker):
    env = dict(BROKER_CONNECTION_TIMEOUT=1, BROKER_RATIONAL_DELAY=0, BROKER_ADVISORY_CHANNEL="adv")
    tmp = tmp_path_factory.mktemp("pg")
    with django_db_blocker.unblock():
        one = start_web(tmp, workers=1, threads=16, **env)
        try:
            two = start_web(tmp, workers=1, threads=16, **env)
        except Exception:
            one.stop()
            raise
    try:
        yield one, two
    finally:
        one.stop()
        two.stop()


class Broker:
    """Channel ch / producer pr / one pull consumer per test, through two servers."""

    def __init__(self, one, two):
        self.urls = [one.url, two.url]
        s = requests.Session()
        assert s.put(f"{one.url}/channel/ch", data={"token": "ct"}, headers=ADMIN).status_code == 200
        assert s.put(f"{one.url}/channel/adv", data={"token": "advt"}, headers=ADMIN).status_code == 200
        assert s.put(f"{one.url}/channel/adv/consumer/watch", data={"token": "wt", "type": "pull"},
                     headers=ADMIN).status_code == 200
        assert s.put(f"{one.url}/producer/pr", data={"token": "prt"}, headers=ADMIN).status_code == 200
        self.n = 0

    def consumer(self, policy, **extra):
        body = {"token": "pt", "type": "pull", "priorityPolicy": policy, "priorityGroups": ["A"], **extra}
        r = requests.put(f"{self.urls[0]}/channel/ch/consumer/pc", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        return r.json()

    def base(self, server=0):
        return f"{self.urls[server]}/channel/ch/consumer/pc"

    def publish(self, n):
        batch = [{"MessageID": f"m{i}", "Payload": f"p{i}"} for i in range(self.n, self.n + n)]
        self.n += n
        r = requests.post(f"{self.urls[0]}/channel/ch/messages", json=batch, headers=PRODUCER)
        assert r.status_code == 201, r.text
        return [m["MessageID"] for m in batch]

    def pull(self, server=0, timeout=30, **body):
        """A pull of group A; claimed jobs stay in flight for 30 s unless IncrementalTimeout says otherwise
        (the test servers' connection timeout is 1 s, so a job without it is requeued after 1.25 s)."""
        body = {"group": "A", "IncrementalTimeout": 30, **body}
        return requests.post(f"{self.base(server)}/pull", json=body, headers=TOKENS,
                             timeout=timeout)

    def stats(self):
        return requests.get(self.base(), headers=TOKENS).json()

    def wait_waiting(self, n, deadline=15):
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.stats()["NumWaiting"] >= n:
                return
            time.sleep(0.05)
        raise AssertionError(f"NumWaiting never reached {n}: {self.stats()}")

    def advisories(self):
        r = requests.get(f"{self.base()}/advisories", headers=TOKENS)
        assert r.status_code == 200, r.text
        return r.json()["Result"]

    def published_advisories(self):
        """What subscribers of BROKER_ADVISORY_CHANNEL received."""
        r = requests.get(f"{self.urls[1]}/channel/adv/consumer/watch/queued-jobs?limit=100",
                         headers={"X-Broker-Channel-Token": "advt", "X-Broker-Consumer-Token": "wt"})
        assert r.status_code == 200, r.text
        return [json.loads(j["Message"]["Payload"]) for j in r.json()["Result"]]


class Async:
    """A pull running in a thread (a long-poll), its response collected later."""

    def __init__(self, fn, **kwargs):
        self.response = None
        self.error = None

        def run():
            try:
                self.response = fn(**kwargs)
            except Exception as exc:  # noqa: BLE001
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout=40):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "pull did not return"
        if self.error:
            raise self.error
        return self.response


def ids(response):
    assert response.status_code == 200, response.text
    return [j["Message"]["MessageID"] for j in response.json()["Result"]]


@pytest.fixture
def broker(servers, transactional_db):
    return Broker(*servers)


def test_overflow_min_pending_min_ack_pending_or_and_no_blocking(broker):
    broker.consumer("overflow")
    broker.publish(5)
    hold = {"IncrementalTimeout": 30}  # the test servers' short deadlines must not requeue jobs here
    assert ids(broker.pull(min_pending=3, **hold)) == ["m0"]  # 5 pending >= 3
    assert ids(broker.pull(min_pending=10, expires=0.5, **hold)) == []  # 4 pending < 10: waits, ends empty
    assert broker.stats()["NumWaiting"] == 0
    # OR: min_ack_pending met by another client's unacknowledged jobs
    assert ids(broker.pull(min_pending=10, min_ack_pending=3, expires=0.3, **hold)) == []  # 1 unacked < 3
    assert ids(broker.pull(server=1, batch=2, **hold)) == ["m1", "m2"]  # another client, no ack
    assert ids(broker.pull(min_pending=10, min_ack_pending=3, **hold)) == ["m3"]  # 3 unacked >= 3
    assert ids(broker.pull(min_pending=1, **hold)) == ["m4"]  # the last one
    # an ineligible waiting pull does not block an eligible one behind it
    p1 = Async(broker.pull, min_pending=1000, expires=3, **hold)
    broker.wait_waiting(1)
    p2 = Async(broker.pull, server=1, expires=10, **hold)
    broker.wait_waiting(2)
    broker.publish(1)
    assert ids(p2.result()) == ["m5"]
    assert ids(p1.result()) == []


def test_pinned_one_puller_gets_everything_with_one_pin_and_wrong_id_is_423(broker):
    broker.consumer("pinned_client", priorityTimeout=10)
    broker.publish(10)
    a = broker.pull(batch=3)
    assert ids(a) == ["m0", "m1", "m2"]
    pin = a.headers["X-Broker-Pin-Id"]
    assert pin and a.json()["PinId"] == pin and {j["PinId"] for j in a.json()["Result"]} == {pin}
    b = broker.pull(server=1, batch=3, expires=1)  # a standby on the other process: nothing
    assert ids(b) == [] and "X-Broker-Pin-Id" not in b.headers
    again = broker.pull(server=1, batch=2, id=pin)  # the pinned client, through either process
    assert ids(again) == ["m3", "m4"] and again.headers["X-Broker-Pin-Id"] == pin
    started = time.monotonic()
    wrong = broker.pull(id="WRONG", expires=20)
    assert wrong.status_code == 423 and wrong.json()["error"] == "pin_id_mismatch"
    assert time.monotonic() - started < 10  # answered at once, not after the wait
    state = broker.stats()["PriorityGroups"]
    assert state[0]["group"] == "A" and state[0]["pinned_client_id"] == pin and state[0]["pinned_ts"]
    assert broker.stats()["NumWaiting"] == 0
    recorded = broker.advisories()
    assert [(a["type"], a.get("pinned_id")) for a in recorded] == [("consumer_group_pinned", pin)]
    assert recorded[0]["channel"] == "ch" and recorded[0]["consumer"] == "pc" and recorded[0]["timestamp"]
    published = broker.published_advisories()
    assert [(a["type"], a["pinned_id"], a["group"]) for a in published] == [("consumer_group_pinned", pin, "A")]


def test_pinned_client_pulling_every_2s_keeps_a_3s_pin(broker):
    broker.consumer("pinned_client", priorityTimeout=3)
    broker.publish(20)
    first = broker.pull()
    pin = first.headers["X-Broker-Pin-Id"]
    standby = Async(broker.pull, server=1, expires=8)
    for _ in range(4):
        time.sleep(2)
        r = broker.pull(id=pin)
        assert r.status_code == 200 and len(ids(r)) == 1 and r.headers["X-Broker-Pin-Id"] == pin
    assert ids(standby.result()) == []
    assert [a["type"] for a in broker.advisories()] == ["consumer_group_pinned"]


def test_silent_pinned_client_hands_the_pin_to_the_standby_after_the_timeout(broker):
    broker.consumer("pinned_client", priorityTimeout=2)
    broker.publish(5)
    old = broker.pull(IncrementalTimeout=30).headers["X-Broker-Pin-Id"]
    started = time.monotonic()
    standby = broker.pull(server=1, expires=15)
    assert time.monotonic() - started >= 1.5
    assert ids(standby) == ["m1"]
    new = standby.headers["X-Broker-Pin-Id"]
    assert new and new != old
    got = [(a["type"], a.get("pinned_id"), a.get("reason")) for a in broker.advisories()]
    assert got == [("consumer_group_pinned", old, None), ("consumer_group_unpinned", None, "timeout"),
                   ("consumer_group_pinned", new, None)]
    assert [a["type"] for a in broker.published_advisories()] == [
        "consumer_group_pinned", "consumer_group_unpinned", "consumer_group_pinned"]


def test_an_aborted_long_poll_does_not_release_the_pin_before_the_timeout(broker):
    broker.consumer("pinned_client", priorityTimeout=4)
    broker.publish(1)
    pin = broker.pull().headers["X-Broker-Pin-Id"]
    with pytest.raises(requests.exceptions.ReadTimeout):
        broker.pull(id=pin, expires=30, timeout=0.5)  # the client gives up: the connection closes
    broker.publish(3)
    assert ids(broker.pull(server=1, expires=1.5)) == []  # still pinned: the standby waits
    assert broker.stats()["PriorityGroups"][0]["pinned_client_id"] == pin
    later = broker.pull(server=1, expires=15)  # after the timeout the standby gets the pin
    assert len(ids(later)) == 1 and later.headers["X-Broker-Pin-Id"] != pin
    assert [a.get("reason") for a in broker.advisories() if a["type"] == "consumer_group_unpinned"] == ["timeout"]


def test_unpin_gives_the_next_job_to_another_pull_and_the_old_pin_gets_423(broker):
    broker.consumer("pinned_client", priorityTimeout=30)
    broker.publish(1)
    pin = broker.pull().headers["X-Broker-Pin-Id"]
    old = Async(broker.pull, id=pin, expires=15)
    broker.wait_waiting(1)
    other = Async(broker.pull, server=1, expires=15)
    broker.wait_waiting(2)
    url = f"{broker.base(1)}/unpin"
    assert requests.post(url, json={}, headers=TOKENS).json()["error"] == "group_missing"
    assert requests.post(url, json={"group": "bad name\r\n"}, headers=TOKENS).json()["error"] == "invalid_group_name"
    r = requests.post(url, json={"group": "B"}, headers=TOKENS)
    assert r.status_code == 404 and r.json()["error"] == "group_not_found"
    assert requests.post(url, json={"group": "A"}, headers={"X-Broker-Admin-Token": "nope"}).status_code == 403
    r = requests.post(url, json={"group": "A"}, headers=TOKENS)
    assert r.status_code == 200 and r.json()["Unpinned"] is True
    assert "pinned_client_id" not in broker.stats()["PriorityGroups"][0]
    assert requests.post(url, json={"group": "A"}, headers=ADMIN).json()["Unpinned"] is False
    broker.publish(1)
    r = old.result()
    assert r.status_code == 423 and r.json()["error"] == "wrong_pin_id"
    got = other.result()
    assert ids(got) == ["m1"] and got.headers["X-Broker-Pin-Id"] not in ("", pin)
    reasons = [a.get("reason") for a in broker.advisories() if a["type"] == "consumer_group_unpinned"]
    assert reasons == ["admin"]


def test_unacknowledged_jobs_of_the_old_pin_go_to_the_new_pin_first(broker):
    broker.consumer("pinned_client", priorityTimeout=30)
    broker.publish(3)
    a = broker.pull(batch=3, IncrementalTimeout=0)  # deadline: 1.25 s, never acked...
    held = [j["ID"] for j in a.json()["Result"]]
    r = requests.post(f"{broker.base()}/ack", json={"Jobs": [{"ID": held[0], "NextState": "DELIVERED"}]},
                      headers=TOKENS)  # ... except the first
    assert r.json()["Result"][0]["Status"] == "DELIVERED"
    assert requests.post(f"{broker.base()}/unpin", json={"group": "A"}, headers=ADMIN).status_code == 200
    time.sleep(1.5)
    broker.publish(2)
    b = broker.pull(server=1, batch=4, expires=10)
    body = b.json()["Result"]
    assert [j["Message"]["MessageID"] for j in body] == ["m1", "m2", "m3", "m4"]
    assert [j["Attempt"] for j in body] == [2, 2, 1, 1]
    assert b.headers["X-Broker-Pin-Id"] != a.headers["X-Broker-Pin-Id"]


def test_prioritized_order_and_take_over(broker):
    broker.consumer("prioritized")
    p3 = Async(broker.pull, priority=3, expires=15)
    broker.wait_waiting(1)
    p1 = Async(broker.pull, server=1, priority=1, expires=15)
    broker.wait_waiting(2)
    p2 = Async(broker.pull, priority=2, batch=2, expires=15)
    broker.wait_waiting(3)
    for _ in range(4):
        broker.publish(1)
        time.sleep(0.2)
    assert ids(p1.result()) == ["m0"]
    assert ids(p2.result()) == ["m1", "m2"]
    assert ids(p3.result()) == ["m3"]

    # a newly arriving lower number takes over from a partly served higher one
    p3 = Async(broker.pull, priority=3, batch=3, expires=6)
    broker.wait_waiting(1)
    broker.publish(1)  # m4 -> p3
    time.sleep(0.5)
    p2 = Async(broker.pull, server=1, priority=2, batch=2, expires=15)
    broker.wait_waiting(2)
    broker.publish(1)  # m5 -> p2
    time.sleep(0.5)
    p1 = Async(broker.pull, priority=1, expires=15)
    broker.wait_waiting(3)
    broker.publish(3)  # m6 -> p1, m7 -> p2 (its last), m8 -> p3
    assert ids(p1.result()) == ["m6"]
    assert ids(p2.result()) == ["m5", "m7"]
    assert ids(p3.result()) == ["m4", "m8"]
