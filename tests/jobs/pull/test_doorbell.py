"""The doorbell for pull consumers (consumers/doorbell.py): a real ringer loop (in a thread, or in
a real qcluster) POSTing to a real receiver on 127.0.0.1.

Definition under test: a check that sees no ready QUEUED job arms the doorbell; ready jobs ring
it when armed or when the consumer took the newest job of the last ring; at most one ring per
notifyInterval; a failed ring re-arms (tried again after the interval while jobs wait)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import pytest
from standardwebhooks import Webhook

from consumers.models import DoorbellState
from tests.helpers import admin_form_data, stopping
from tests.jobs.conftest import Reply
from tests.jobs.pull.conftest import PullClient

pytestmark = pytest.mark.django_db(transaction=True)

BELL = "/bell"


class RingerThread:
    def __init__(self, use_lock: bool = True) -> None:
        from jobs.pull.doorbell import Ringer

        self.ringer = Ringer(use_lock=use_lock)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.ringer.run, args=(self.stop_event,), daemon=True)

    def start(self) -> "RingerThread":
        self.thread.start()
        assert self.ringer.holding.wait(20), "ringer did not take its lock"
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.ringer.wake()
        self.thread.join(timeout=20)
        self.ringer.close()


@pytest.fixture
def ringer(settings):
    settings.BROKER_DOORBELL_POLL = 0.2
    settings.BROKER_DOORBELL_TIMEOUT = 1.0
    with stopping(RingerThread) as start:
        yield start


@pytest.fixture
def bell(make, receiver):
    """Channel ch1, producer p1 and pull consumer d1 (token d1-token) ringing receiver /bell."""
    body = make.basics().consumer("d1", type="pull", token="d1-token", callback=receiver.url(BELL), notifyInterval="0.5")
    assert body["Type"] == "pull" and body["CallbackURL"] == receiver.url(BELL) and body["NotifyInterval"] == 0.5
    return body


def puller(client_anon, consumer="d1", token="d1-token"):
    return PullClient(client_anon, base=f"/channel/ch1/consumer/{consumer}",
                      headers={"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": token})


def drain(pc) -> int:
    n = 0
    while True:
        jobs = pc.pull(batch=100).json()["Result"]
        if not jobs:
            return n
        n += len(jobs)
        assert pc.ack([{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]).status_code == 200


def rings(receiver):
    return receiver.at(BELL)


def rang_at(ring) -> float:
    """The ring's database time (seconds), from its webhook-id ``doorbell_<pk>_<ms>``: the
    interval is enforced on these, arrival times at the receiver also carry scheduling jitter."""
    return int(ring.headers["webhook-id"].rsplit("_", 1)[1]) / 1000.0


def spaced(ring_list, interval: float) -> bool:
    times = [rang_at(r) for r in ring_list]
    return all(b - a >= interval - 0.002 for a, b in zip(times, times[1:]))


def test_a_burst_rings_once_with_signed_json_and_not_again_while_nothing_is_drained(bell, make, receiver, ringer):
    ringer()
    time.sleep(0.5)  # a first check sees the empty queue (arms)
    assert rings(receiver) == []
    for i in range(30):
        assert make.publish(HTTP_X_BROKER_MESSAGE_ID=f"b{i}").status_code == 201
    receiver.wait(lambda: rings(receiver), timeout=20, what="the doorbell")
    time.sleep(2.0)  # four intervals: the queue stays non-empty and nobody pulls
    assert len(rings(receiver)) == 1
    ring = rings(receiver)[0]
    assert ring.headers["content-type"] == "application/json"
    assert ring.headers["x-broker-event"] == "doorbell"
    Webhook(bell["SigningSecret"]).verify(ring.body, ring.headers)  # Standard Webhooks signature
    body = json.loads(ring.body)
    assert set(body) == {"channel", "consumer", "NumPending", "OldestQueuedAt"}
    assert body["channel"] == "ch1" and body["consumer"] == "d1"
    assert 1 <= body["NumPending"] <= 30
    from jobs.models import Job

    first = Job.objects.filter(consumer__consumer_id="d1").order_by("id").first()
    assert datetime.fromisoformat(body["OldestQueuedAt"].replace("Z", "+00:00")) == first.created_at
    assert DoorbellState.objects.get().rings == 1


def test_rings_again_once_the_queue_drained_and_new_jobs_arrive(bell, make, receiver, ringer, client_anon):
    pc = puller(client_anon)
    ringer()
    make.publish(HTTP_X_BROKER_MESSAGE_ID="a0")
    receiver.wait(lambda: rings(receiver), timeout=20, what="the first ring")
    assert drain(pc) == 1
    # drained and published again right away (a check may not have seen the empty queue): the
    # consumer took the job it was rung for, so the new one rings, no sooner than the interval
    make.publish(HTTP_X_BROKER_MESSAGE_ID="a1")
    receiver.wait(lambda: len(rings(receiver)) >= 2, timeout=20, what="the second ring")
    first, second = rings(receiver)[:2]
    assert spaced([first, second], 0.5)
    assert json.loads(second.body)["NumPending"] == 1
    time.sleep(1.2)
    assert len(rings(receiver)) == 2  # a1 still queued, nothing new drained: quiet


def test_a_job_coming_back_after_a_delay_rings_again(bell, make, receiver, ringer, client_anon):
    """Taken, then nacked with a delay: while it waits for its next attempt the queue has no ready
    job (the doorbell arms), and when it is due again the doorbell rings for it."""
    pc = puller(client_anon)
    ringer()
    make.publish(HTTP_X_BROKER_MESSAGE_ID="r0")
    receiver.wait(lambda: rings(receiver), timeout=20, what="the first ring")
    job = pc.pull().json()["Result"][0]
    r = pc.ack([{"ID": job["ID"], "NextState": "QUEUED", "Delay": 1.5}])
    assert r.json()["Result"][0]["Status"] == "QUEUED"
    time.sleep(0.8)
    assert len(rings(receiver)) == 1  # not ready yet
    receiver.wait(lambda: len(rings(receiver)) >= 2, timeout=20, what="the ring for the job due again")
    assert pc.pull().json()["Result"][0]["ID"] == job["ID"]


def test_ring_rate_is_bounded_by_the_interval_with_two_ringers(bell, make, receiver, ringer, client_anon):
    """A consumer that drains its queue whenever it is rung, while messages keep arriving: the
    doorbell rings again and again, but at most once per interval, even with two ringers (no
    lock) racing for it."""
    pc = puller(client_anon)
    ringer(use_lock=False)
    ringer(use_lock=False)
    start = time.monotonic()
    seen = 0
    while time.monotonic() - start < 3.0:
        assert make.publish().status_code == 201
        if len(rings(receiver)) > seen:
            seen = len(rings(receiver))
            drain(pc)
        time.sleep(0.02)
    time.sleep(0.3)
    elapsed = time.monotonic() - start
    times = [r.at for r in rings(receiver)]
    assert 2 <= len(times) <= elapsed / 0.5 + 1, times
    assert spaced(rings(receiver), 0.5), [rang_at(r) for r in rings(receiver)]


@pytest.mark.parametrize("failure", ["500", "refused"])
def test_a_failing_doorbell_is_tried_again_at_most_once_per_interval(failure, make, api, receiver, ringer, caplog):
    make.channel()
    make.producer()
    url = receiver.url(BELL)
    if failure == "refused":
        from tests.processes import free_port

        url = f"http://127.0.0.1:{free_port()}/bell"  # nothing listens there
    receiver.behave(BELL, lambda n, request: Reply(500))
    make.consumer("d1", type="pull", token="d1-token", callback=url, notifyInterval="0.5")
    thread = ringer()
    start = time.monotonic()
    for i in range(5):
        assert make.publish().status_code == 201
    time.sleep(3.0)
    thread.stop()  # no ring in flight while the state and the receiver are compared
    elapsed = time.monotonic() - start
    state = DoorbellState.objects.get()
    assert 2 <= state.rings <= elapsed / 0.5 + 1, state.rings  # re-armed by each failure
    assert state.failures >= state.rings - 1
    logged = [r for r in caplog.records if r.name == "consumers.doorbell" and r.levelname == "WARNING"]
    assert logged and all(r.consumer_id == "d1" and r.channel_id == "ch1" for r in logged)  # JSON log fields
    doorbell = api.get("/channel/ch1/consumer/d1").json()["Doorbell"]
    assert doorbell["Rings"] >= 2 and doorbell["Failures"] >= 1 and doorbell["RangAt"].endswith("Z")
    if failure == "500":
        assert len(rings(receiver)) == state.rings
        assert spaced(rings(receiver), 0.5), [rang_at(r) for r in rings(receiver)]


def test_a_hanging_receiver_never_delays_publishing(bell, make, receiver, ringer, client_anon):
    receiver.behave(BELL, lambda n, request: Reply(204, delay=3.0))  # longer than the ring timeout
    pc = puller(client_anon)
    ringer()
    start = time.monotonic()
    assert make.publish().status_code == 201
    receiver.wait(lambda: rings(receiver), timeout=20, what="the first ring")
    assert receiver.active == 1  # the receiver is hanging on it now
    for i in range(20):
        assert make.publish().status_code == 201  # answered while the doorbell hangs
        if i % 5 == 0:
            drain(pc)
    assert receiver.active >= 1
    time.sleep(1.5)
    # the first ring timed out (1 s): re-armed and rung again, no more than once per interval
    times = [r.at for r in rings(receiver)]
    assert 2 <= len(times) <= (time.monotonic() - start) / 0.5 + 1


def test_push_consumers_and_pull_consumers_without_callback_never_ring(make, receiver, ringer, client_anon):
    make.channel()
    make.producer()
    make.consumer("c1", callback=receiver.url("/push"))  # push: its callbacks are deliveries, never rings
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    make.consumer("d1", type="pull", token="d1-token", callback=receiver.url(BELL), notifyInterval="0.5")
    ringer()
    for _ in range(5):
        assert make.publish().status_code == 201
    receiver.wait(lambda: rings(receiver), timeout=20, what="the ring of d1")
    time.sleep(1.0)
    assert [json.loads(r.body)["consumer"] for r in receiver.requests] == ["d1"]
    assert list(DoorbellState.objects.values_list("consumer__consumer_id", flat=True)) == ["d1"]


def test_a_paused_consumer_is_rung_when_it_resumes(bell, make, api, receiver, ringer):
    assert api.post("/channel/ch1/consumer/d1/pause").status_code == 200
    ringer()
    make.publish()
    time.sleep(1.0)
    assert rings(receiver) == []  # a pull would get nothing now
    assert api.post("/channel/ch1/consumer/d1/resume").status_code == 200
    receiver.wait(lambda: rings(receiver), timeout=20, what="the ring after resume")


def test_consumer_api_notify_interval_and_pull_callback(make, api):
    make.channel()
    body = make.consumer("d1", type="pull", token="d1-token", callback="http://127.0.0.1:9/bell")
    assert body["CallbackURL"] == "http://127.0.0.1:9/bell" and body["NotifyInterval"] == 1.0
    for bad in ("0", "-1", "abc", "nan", "inf"):
        r = api.put("/channel/ch1/consumer/d1", {"notifyInterval": bad})
        assert r.status_code == 400 and r.json()["error"] == "invalid_notifyInterval", (bad, r.content)
    since = api.get("/channel/ch1/consumer/d1")["Last-Modified"]
    r = api.put("/channel/ch1/consumer/d1", {"notifyInterval": "2.5"}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200 and r.json()["NotifyInterval"] == 2.5, r.content
    assert api.get("/channel/ch1/consumer/d1").json()["NotifyInterval"] == 2.5


def test_one_ringer_holds_the_lock_and_another_takes_over(ringer):
    first = ringer()
    second = RingerThread()
    second.thread.start()
    try:
        assert not second.ringer.holding.wait(1.0)  # the first one rings; this one waits
        first.stop()
        assert second.ringer.holding.wait(10), "the second ringer did not take over"
    finally:
        second.stop()


def test_qcluster_rings_for_a_publish_over_http(tmp_path, make, receiver):
    """Black box: gunicorn publishes, a real qcluster's push dispatcher process runs the ringer,
    and while the receiver hangs, publishing over HTTP keeps answering 201 at once."""
    import requests

    from tests.conftest import ADMIN_TOKEN
    from tests.processes import start_qcluster, start_web

    hang = threading.Event()
    receiver.behave(BELL, lambda n, request: Reply(204, delay=5.0 if hang.is_set() else 0.0))
    web = start_web(tmp_path, workers=1, threads=4)
    cluster = start_qcluster(tmp_path, BROKER_Q_WORKERS="2", BROKER_PUSH_POLL="0.2")
    admin = {"X-Broker-Admin-Token": ADMIN_TOKEN}
    publish = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "dp", "X-Broker-Producer-Token": "pt",
               "Content-Type": "application/json"}
    try:
        assert requests.put(f"{web.url}/channel/dch", data={"token": "ct"}, headers=admin).status_code == 200
        assert requests.put(f"{web.url}/producer/dp", data={"token": "pt"}, headers=admin).status_code == 200
        r = requests.put(f"{web.url}/channel/dch/consumer/dd", headers=admin, data={
            "token": "dt", "type": "pull", "callbackUrl": receiver.url(BELL), "notifyInterval": "0.5"})
        assert r.status_code == 200, r.text
        secret = r.json()["SigningSecret"]
        receiver.wait(lambda: DoorbellState.objects.exists(), timeout=60, what="the ringer's first check")
        for _ in range(10):
            assert requests.post(f"{web.url}/channel/dch/broadcast", data=b"{}", headers=publish).status_code == 201
        receiver.wait(lambda: rings(receiver), timeout=30, what="the doorbell from the qcluster")
        ring = rings(receiver)[0]
        Webhook(secret).verify(ring.body, ring.headers)
        assert json.loads(ring.body)["consumer"] == "dd" and json.loads(ring.body)["channel"] == "dch"
        # drain, then make the receiver hang on the next ring: publishing is not slowed down
        pull = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "dt"}
        while requests.post(f"{web.url}/channel/dch/consumer/dd/pull", json={"batch": 100},
                            headers=pull).json()["Result"]:
            pass
        hang.set()
        assert requests.post(f"{web.url}/channel/dch/broadcast", data=b"{}", headers=publish).status_code == 201
        receiver.wait(lambda: receiver.active, timeout=30, what="a hanging ring")
        for _ in range(20):
            r = requests.post(f"{web.url}/channel/dch/broadcast", data=b"{}", headers=publish, timeout=30)
            assert r.status_code == 201
        assert receiver.active  # every publish was answered while the receiver still hangs
    finally:
        cluster.stop()
        web.stop()


SEED = """
[initial-channels]
ch1=Channel one
[initial-channel-tokens]
ch1=ch-token
[initial-consumers]
d1=http://127.0.0.1:9/bell
d2=
d3=http://127.0.0.1:9/bell
[d1]
token=d1-token
channel=ch1
type=pull
notifyInterval=0.25
[d2]
token=d2-token
channel=ch1
type=pull
[d3]
token=d3-token
channel=ch1
type=pull
notifyInterval=0
"""


def test_seed_notify_interval():
    from consumers.models import Consumer
    from consumers.seed import seed_apply, seed_parse

    plan = seed_parse(SEED)
    assert plan.consumers["d1"]["notify_interval"] == 0.25 and "notify_interval" not in plan.consumers["d2"]
    assert "d3" not in plan.consumers and any("d3" in e for e in plan.errors)
    seed_apply(plan)
    d1 = Consumer.objects.get(consumer_id="d1")
    assert (d1.type, d1.callback_url, d1.notify_interval) == ("pull", "http://127.0.0.1:9/bell", 0.25)
    assert Consumer.objects.get(consumer_id="d2").notify_interval == 1.0


def test_admin_edits_notify_interval(admin_client, make):
    from consumers.models import Consumer
    from tests.web.admin.test_consumers_admin import URL

    make.channel()
    make.consumer("d1", type="pull", token="d1-token", callback="http://127.0.0.1:9/bell")
    consumer = Consumer.objects.get(consumer_id="d1")
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    assert "notify_interval" in r.context["adminform"].form.fields
    r = admin_client.post(f"{URL}{consumer.pk}/change/", admin_form_data(r, notify_interval="0"))
    assert "notify_interval" in r.context["adminform"].form.errors
    r = admin_client.get(f"{URL}{consumer.pk}/change/")
    r = admin_client.post(f"{URL}{consumer.pk}/change/", admin_form_data(r, notify_interval="3"), follow=True)
    assert r.status_code == 200
    consumer.refresh_from_db()
    assert consumer.notify_interval == 3.0
