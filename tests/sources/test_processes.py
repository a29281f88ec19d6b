"""Sources across real web processes (gunicorn as users run it): a redelivery is recognised by
another process and after a restart; a source deleted while requests arrive answers 404 within a
second everywhere and publishes nothing after its DELETE has answered, while every request
answered before it kept its message."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from broker.models import Message
from tests.conftest import ADMIN_TOKEN
from tests.processes import start_web
from tests.sources.conftest import GITHUB_SECRET, github_headers

pytestmark = pytest.mark.django_db(transaction=True)


def make_source(url: str) -> str:
    admin = {"X-Broker-Admin-Token": ADMIN_TOKEN}
    assert requests.put(f"{url}/channel/ch1", json={"token": "ch-token"}, headers=admin, timeout=10).ok
    r = requests.put(f"{url}/channel/ch1/source/gh", json={"verify": "github", "secret": GITHUB_SECRET},
                     headers=admin, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()["ID"]


def deliver(url: str, source_id: str, delivery: str, session=requests) -> int:
    body = f'{{"delivery": "{delivery}"}}'.encode()
    return session.post(f"{url}/in/{source_id}", data=body, timeout=10,
                        headers={**github_headers(body, delivery=delivery), "Content-Type": "application/json"}
                        ).status_code


def test_redeliveries_across_two_processes_and_a_restart(tmp_path):
    one, two = start_web(tmp_path), start_web(tmp_path)
    try:
        source_id = make_source(one.url)
        deliveries = [f"d-{i}" for i in range(20)]
        assert [deliver(one.url, source_id, d) for d in deliveries] == [200] * 20
        assert [deliver(two.url, source_id, d) for d in deliveries] == [200] * 20  # the other process
        one.stop()
        one = start_web(tmp_path)  # a restart: nothing in memory survives
        assert [deliver(one.url, source_id, d) for d in deliveries] == [200] * 20
        assert [deliver(two.url, source_id, d) for d in ["d-new", *deliveries[:3]]] == [200] * 4
        assert Message.objects.count() == 21
        assert sorted(Message.objects.values_list("headers__X-Broker-Source-Delivery", flat=True)) == sorted(
            [*deliveries, "d-new"])
    finally:
        one.stop()
        two.stop()


def test_a_source_deleted_while_requests_arrive(tmp_path):
    web = start_web(tmp_path, workers=2)
    try:
        source_id = make_source(web.url)
        answers: list[tuple[float, float, str, int]] = []  # (sent, answered, delivery, status)
        stop = threading.Event()

        def send(lane: int) -> None:
            session = requests.Session()
            n = 0
            while not stop.is_set():
                delivery = f"l{lane}-{n}"
                sent = time.monotonic()
                status = deliver(web.url, source_id, delivery, session)
                answers.append((sent, time.monotonic(), delivery, status))
                n += 1

        lanes = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for lane in lanes:
            lane.start()
        time.sleep(1.5)
        r = requests.delete(f"{web.url}/channel/ch1/source/gh", headers={"X-Broker-Admin-Token": ADMIN_TOKEN},
                            timeout=10)
        deleted_at = time.monotonic()
        assert r.status_code == 204
        count_at_delete = Message.objects.count()
        time.sleep(2.0)
        stop.set()
        for lane in lanes:
            lane.join(15)
        stored = set(Message.objects.values_list("headers__X-Broker-Source-Delivery", flat=True))

        assert len(stored) == count_at_delete > 0  # nothing published after the DELETE answered
        accepted = {d for _, _, d, status in answers if status == 200}
        assert accepted == stored  # every accepted request kept its message, no other one was stored
        late = [(sent - deleted_at, status) for sent, _, _, status in answers if sent > deleted_at + 1.0]
        assert late and all(status == 404 for _, status in late), late[:5]
        assert {status for _, _, _, status in answers} <= {200, 404}
    finally:
        web.stop()
