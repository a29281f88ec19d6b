"""The single publish answered on the web server's event loop (web.server.native) answers exactly as
the full stack does: every request below is sent to the same server twice, once with the native
routes and once without (Django's WSGI application, fast lane included), and the answers (status,
body, every header but Date; a 201's Location up to its new message id) must be equal, the stored
messages too. Requests the native route must leave to the full stack are checked as well."""

from __future__ import annotations

import base64
import json
import re
import time

import pytest
from django.core.wsgi import get_wsgi_application

from broker.errors import Unavailable
from broker.models import Message
from eventtypes.validation import channel_rules
from jobs.publish import grouped
from tests.conftest import ADMIN_TOKEN
from tests.web.server.conftest import Reader, served_natively
from web.middleware import signature_make
from web.server import native as native_module
from web.server.native import NATIVE_ROUTES, Native

pytestmark = pytest.mark.django_db(transaction=True)
GOOD = {"X-Broker-Channel-Token": "ch-token", "X-Broker-Producer-ID": "p1", "X-Broker-Producer-Token": "p-token"}


@pytest.fixture
def broker(serve, make):
    make.basics()
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    with served_natively(serve) as served:
        yield served


def post(served, path: str, body: bytes, headers: dict, *, host: str = "127.0.0.1"):
    if path.startswith("/channel/"):  # the channel's event types held, as while publishes come: taken on the loop
        channel_rules(path.split("/")[2])
    raw = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    raw += [f"{k}: {v}" for k, v in headers.items()]
    sock = served.connect()
    try:
        sock.sendall(("\r\n".join(raw) + "\r\n\r\n").encode("latin-1") + body)
        return Reader(sock).response()
    finally:
        sock.close()


def shape(answer) -> tuple:
    """What must be equal: status, body, headers (but Date), a Location's message id masked."""
    headers = sorted((k, re.sub(r"/([a-z-]*message)/[^/]+$", r"/\1/<id>", v) if k == "Location" else v)
                     for k, v in answer.headers if k != "Date")
    return answer.status, answer.body, headers


def both(broker, path: str, body: bytes, headers: dict, *, lane: bool = True, ids=("n", "f"), **options):
    """(native answer, full stack answer) of the same request; ``lane``: whether the native route
    must have taken it. With ``ids``, each way gets its own X-Broker-Message-ID (a 201 each)."""
    served, native = broker
    answers = []
    for way, mid in zip(("native", "full"), ids or (None, None)):
        served.server.native = native if way == "native" else None
        extra = {"X-Broker-Message-ID": mid} if mid else {}
        handled = native.handled
        answers.append(post(served, path, body, {**headers, **extra}, **options))
        assert (native.handled - handled == 1) is (lane and way == "native"), way
    served.server.native = native
    assert shape(answers[0]) == shape(answers[1]), (answers[0].__dict__, answers[1].__dict__)
    return answers[0]


def stored(mid: str) -> tuple:
    m = Message.objects.get(message_id=mid)
    return bytes(m.payload), m.content_type, m.priority, m.headers, m.type


def test_a_publish_is_answered_on_the_loop_as_the_full_stack_answers_it(broker):
    headers = {**GOOD, "Content-Type": "application/json", "X-Broker-Message-Priority": "7",
               "X-Broker-Metadata-Headers": "X-Seq, content-type, X-Absent", "X-Seq": "42",
               "X-Broker-Message-Type": "order.created", "X-Broker-Message-TTL": "600",
               "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    answer = both(broker, "/channel/ch1/broadcast", b'{"n": 1}', headers, ids=("n1", "f1"))
    assert answer.status == 201 and answer.header("Location") == "/channel/ch1/message/n1"
    assert answer.header("Allow") == "POST, OPTIONS" and answer.header("X-Frame-Options") == "DENY"
    assert stored("n1") == stored("f1")
    assert stored("n1")[3] == {"X-Seq": "42", "content-type": "application/json"}
    # a message id that needs quoting in the Location
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD, ids=("n 2/ü".encode().decode("latin-1"), "f 2/ü".encode().decode("latin-1")))
    assert answer.header("Location") == "/channel/ch1/message/n%202%2F%C3%83%C2%BC"  # (WSGI: latin-1, both ways)


@pytest.mark.parametrize("headers,status,code", [
    ({**GOOD, "X-Broker-Channel-Token": "wrong"}, 403, "channel_token_mismatch"),
    ({**GOOD, "X-Broker-Producer-ID": "nobody"}, 401, "producer_not_found"),
    ({**GOOD, "X-Broker-Producer-Token": "wrong"}, 403, "producer_token_mismatch"),
    ({k: v for k, v in GOOD.items() if k != "X-Broker-Producer-ID"}, 401, "producer_not_found"),
])
def test_refused_credentials_answer_the_same(broker, headers, status, code):
    answer = both(broker, "/channel/ch1/broadcast", b"x", headers)
    assert answer.status == status and json.loads(answer.body)["error"] == code


def test_an_unknown_channel_and_a_duplicate_id_answer_the_same(broker):
    answer = both(broker, "/channel/nope/broadcast", b"x", GOOD)
    assert answer.status == 404 and json.loads(answer.body)["error"] == "channel_not_found"
    assert post(broker[0], "/channel/ch1/broadcast", b"x", {**GOOD, "X-Broker-Message-ID": "dup"}).status == 201
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD, ids=("dup", "dup"))
    assert answer.status == 409 and json.loads(answer.body)["error"] == "duplicate_message_id"


def test_a_rate_limited_producer_answers_the_same(broker, make):
    since = make.api.get("/producer/p1")["Last-Modified"]
    assert make.api.put("/producer/p1", {"rateLimitPerSecond": "0.001", "burst": "1"},
                        HTTP_IF_UNMODIFIED_SINCE=since).status_code == 200
    assert post(broker[0], "/channel/ch1/broadcast", b"x", GOOD).status == 201  # the one token
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD)
    assert answer.status == 429 and answer.header("Retry-After") and json.loads(answer.body)["error"] == "rate_limited"


def test_an_overloaded_broker_refuses_the_same_at_once(broker, monkeypatch):
    refusal = Unavailable("overloaded", "the broker is over its capacity: retry after 1 s", retry_after=1)
    monkeypatch.setattr(native_module, "publish_admission", lambda: refusal)
    monkeypatch.setattr(grouped, "publish_admission", lambda: refusal)
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD)
    assert answer.status == 503 and answer.header("Retry-After") == "1"
    assert json.loads(answer.body)["error"] == "overloaded"
    monkeypatch.setattr(native_module, "publish_admission", lambda: None)
    broker[0].server.lag_max = 5.0  # the event loop running behind: refused on the loop
    handled = broker[1].handled
    answer = post(broker[0], "/channel/ch1/broadcast", b"x", GOOD)
    assert answer.status == 503 and json.loads(answer.body)["error"] == "overloaded"
    assert broker[1].handled == handled + 1
    assert not Message.objects.exists()


@pytest.mark.parametrize("body,headers,status", [
    (b"", GOOD, 400),  # empty body
    (b"x", {**GOOD, "X-Broker-Message-Priority": "high"}, 400),
    (b"x", {**GOOD, "X-Broker-Message-Priority": "high", "X-Broker-Channel-Token": "wrong"}, 403),  # credentials first
    (b"x", {**GOOD, "X-Broker-Partition-Key": "k1"}, 201),  # keyed: its own transaction, the full way
    (b"x", {**GOOD, "X-Broker-Scheduled-For": "2099-01-01T00:00:00Z"}, 201),  # scheduled: the full way
    (b"x", {**GOOD, "X-Broker-Gate": "1"}, 400),
])
def test_what_the_native_route_leaves_to_the_full_stack(broker, body, headers, status):
    ids = ("n", "f") if status == 201 else None
    answer = both(broker, "/channel/ch1/broadcast", body, headers, lane=False, ids=ids)
    assert answer.status == status


def test_a_large_body_goes_the_full_way_and_its_credentials_are_checked_first(broker):
    big = b"x" * (200 * 1024)
    assert both(broker, "/channel/ch1/broadcast", big, GOOD, lane=False).status == 201
    answer = both(broker, "/channel/ch1/broadcast", big, {**GOOD, "X-Broker-Producer-Token": "wrong"}, lane=False)
    assert answer.status == 403


def test_host_ssl_and_signature_checks_come_first(broker, settings):
    assert both(broker, "/channel/ch1/broadcast", b"x", GOOD, lane=False, host="evil.example").status == 400
    settings.BROKER_HMAC_SECRET = base64.b64encode(b"native-secret").decode()
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD, lane=False)
    assert answer.status == 401 and json.loads(answer.body)["error"] == "signature_required"
    now = int(time.time())
    signed = {**GOOD, "X-Broker-Signature": f"t={now},v1={signature_make(b'native-secret', now, b'x')}"}
    assert both(broker, "/channel/ch1/broadcast", b"x", signed).status == 201
    bad = {**GOOD, "X-Broker-Signature": f"t={now},v1={'0' * 64}"}
    assert both(broker, "/channel/ch1/broadcast", b"x", bad, lane=False).status == 403


def test_an_ssl_redirect_is_left_to_the_full_stack(broker, serve, settings):
    settings.SECURE_SSL_REDIRECT = True  # before the server starts: middleware reads it when it is made
    native = Native(NATIVE_ROUTES)
    served = serve(get_wsgi_application(), native=native)
    try:
        answer = both((served, native), "/channel/ch1/broadcast", b"x", GOOD, lane=False)
        assert answer.status == 301 and answer.header("Location").startswith("https://")
    finally:
        served.close_pool_connections()
        native.detach()


def test_a_setting_change_remakes_the_201_template(broker, settings):
    assert both(broker, "/channel/ch1/broadcast", b"x", GOOD, ids=("t1", "t2")).header("X-Frame-Options") == "DENY"
    settings.X_FRAME_OPTIONS = "SAMEORIGIN"
    answer = both(broker, "/channel/ch1/broadcast", b"x", GOOD, ids=("t3", "t4"))
    assert answer.header("X-Frame-Options") == "SAMEORIGIN"


def test_other_routes_are_untouched(broker):
    served, native = broker
    handled = native.handled
    sock = served.connect()
    sock.sendall(b"GET /_status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert Reader(sock).response().status == 200
    sock.sendall(f"GET /channel/ch1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Broker-Admin-Token: {ADMIN_TOKEN}\r\n\r\n".encode())
    assert Reader(sock).response().status == 200
    assert native.handled == handled
