"""verify_webhook and webhook_app against real signed deliveries: the broker's push dispatcher and
doorbell ringer (in-process loops, as in tests/jobs/push and tests/jobs/pull) POST to a WSGI receiver built
with webhook_app, served by wsgiref on 127.0.0.1. Both signatures during a secret rotation."""

from __future__ import annotations

import base64
import io
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from broker_client import WebhookVerificationError, verify_webhook, webhook_app

from jobs.models import Job, JobStatus
from tests.helpers import wait_until
from tests.jobs.conftest import dispatcher, push_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Receiver:
    """webhook_app(handler, secret) on a free loopback port; records verified requests."""

    def __init__(self, secret, answer=None):
        self.seen = []
        self.raw = []  # (headers, body) of every request, verified or not
        self.answer = answer

        def handler(request):
            self.seen.append(request)
            return self.answer(request) if self.answer else None

        app = webhook_app(handler, secret)

        def recording(environ, start_response):
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
            self.raw.append((headers, body))
            environ["wsgi.input"] = io.BytesIO(body)
            return app(environ, start_response)

        self.server = make_server("127.0.0.1", 0, recording, server_class=_Server, handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, predicate, timeout=20.0):
        return wait_until(predicate, timeout, "the receiver")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made = []

    def make(secret, answer=None):
        r = Receiver(secret, answer)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def job_status(consumer_id):
    return [JobStatus(s).name for s in Job.objects.filter(consumer__consumer_id=consumer_id).values_list("status", flat=True)]


def test_a_real_delivery_verifies_and_both_signatures_during_a_rotation(make, api, dispatcher, receivers):  # noqa: F811
    make.channel()
    make.producer()
    make.consumer("c1", callback="http://127.0.0.1:9/unused")
    old = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    receiver = receivers(old)
    since = api.get("/channel/ch1/consumer/c1")["Last-Modified"]
    r = api.put("/channel/ch1/consumer/c1", {"callbackUrl": receiver.url}, HTTP_IF_UNMODIFIED_SINCE=since)
    assert r.status_code == 200, r.content
    new = api.post("/channel/ch1/consumer/c1/rotate-secret").json()["SigningSecret"]
    assert new != old
    dispatcher()
    assert make.publish(body=b'{"order": 7}', HTTP_X_BROKER_MESSAGE_ID="m-7").status_code == 201
    receiver.wait(lambda: job_status("c1") == ["DELIVERED"])  # the receiver (old secret) answered 204
    [request] = receiver.seen
    assert request.json() == {"order": 7} and request.message_id == "m-7" and request.event == "message"
    assert request.channel == "ch1" and request.consumer == "c1" and request.job_id
    headers, body = receiver.raw[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    verify_webhook(headers, body, old)  # a receiver still on the old secret
    verify_webhook(headers, body, new)  # one already switched
    verify_webhook(headers, body, [new, old])  # one given both while switching
    with pytest.raises(WebhookVerificationError):
        verify_webhook(headers, body, "whsec_" + base64.b64encode(b"x" * 24).decode())
    with pytest.raises(WebhookVerificationError):
        verify_webhook(headers, body + b" ", old)  # tampered body
    with pytest.raises(WebhookVerificationError):
        verify_webhook({k: v for k, v in headers.items() if k != "webhook-id"}, body, old)


def test_a_receiver_with_the_wrong_secret_refuses_and_the_broker_retries(make, api, dispatcher, receivers):  # noqa: F811
    make.channel()
    make.producer()
    receiver = receivers("whsec_" + base64.b64encode(b"wrong secret 24 bytes!!!").decode())
    make.consumer("c1", callback=receiver.url)
    dispatcher()
    make.publish(body=b"binary \xff\xfe", content_type="application/octet-stream")
    receiver.wait(lambda: len(receiver.raw) >= 2)  # 401, retried after the backoff
    assert receiver.seen == [] and job_status("c1") != ["DELIVERED"]
    headers, body = receiver.raw[0]
    secret = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    verify_webhook(headers, body, secret)  # a body that is not UTF-8 verifies too


def test_gate_answer_from_the_handler_moves_a_partitioned_job(make, api, dispatcher, receivers):  # noqa: F811
    make.channel()
    make.producer()
    make.consumer("c1", callback="http://127.0.0.1:9/unused")
    secret = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    receiver = receivers(secret, answer=lambda req: {"gate": 1, "done": False, "data": {"step": 2}}
                         if req.gate == 0 else None)
    since = api.get("/channel/ch1/consumer/c1")["Last-Modified"]
    api.put("/channel/ch1/consumer/c1", {"callbackUrl": receiver.url}, HTTP_IF_UNMODIFIED_SINCE=since)
    dispatcher()
    make.publish(body=b'{"step": 1}', HTTP_X_BROKER_PARTITION_KEY="order-1")
    receiver.wait(lambda: job_status("c1") == ["DELIVERED"] and len(receiver.seen) == 2)
    first, second = receiver.seen
    assert (first.partition_key, first.gate, second.gate) == ("order-1", 0, 1)
    assert second.json() == {"step": 2}


def test_a_doorbell_verifies(make, api, receivers, settings):
    from tests.jobs.pull.test_doorbell import RingerThread

    settings.BROKER_DOORBELL_POLL = 0.2
    make.channel()
    make.producer()
    make.consumer("d1", type="pull", token="d1-token", callback="http://127.0.0.1:9/unused", notifyInterval="0.5")
    secret = api.get("/channel/ch1/consumer/d1").json()["SigningSecret"]
    receiver = receivers(secret)
    since = api.get("/channel/ch1/consumer/d1")["Last-Modified"]
    api.put("/channel/ch1/consumer/d1", {"callbackUrl": receiver.url, "type": "pull"}, HTTP_IF_UNMODIFIED_SINCE=since)
    ringer = RingerThread().start()
    try:
        time.sleep(0.5)  # a first check sees the empty queue and arms the bell
        make.publish()
        receiver.wait(lambda: receiver.seen)
    finally:
        ringer.stop()
    ring = receiver.seen[0]
    assert ring.event == "doorbell" and ring.json()["consumer"] == "d1" and ring.json()["NumPending"] >= 1
