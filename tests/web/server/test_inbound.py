"""``POST /in/{id}`` answered on the web server's event loop (web.server.inbound) answers exactly as
the full stack does (``SourceReceiveView`` through Django): each request below is sent to the same
server twice, once with the native routes and once without, and the answers (status, body, every
header but Date) must be equal, the stored messages too. Refusals go the full way from the loop;
copies of one delivery in one batch publish once; a publish the thread refuses is answered by the
full way."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker.errors import Unavailable
from broker.models import Message
from jobs.publish.grouped import _publisher
from eventtypes import validation
from eventtypes.validation import channel_rules
from sources.lookup import source_lookup, sources_cache_clear
from sources.models import Source
from sources.tallies import source_counts, source_tallies_close, source_tallies_flush
from tests.sources.conftest import GITHUB_SECRET, _fresh_source_cache, github_headers, slack_headers  # noqa: F401
from tests.web.server.conftest import served_natively
from tests.web.server.test_native import post, shape
from web.server import current
from web.server import inbound as inbound_module

pytestmark = pytest.mark.django_db(transaction=True)
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
def broker(serve, make):
    make.basics()
    make.consumer("c1", type="push", token="c1-token")
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    with served_natively(serve) as served:
        yield served
    source_tallies_close()  # the loop's counts: written, the tally thread's connection closed


def source(make, name: str = "gh", **fields) -> str:
    fields.setdefault("verify", "github")
    fields.setdefault("secret", GITHUB_SECRET)
    r = make.api.put(f"/channel/ch1/source/{name}", fields, format="json")
    assert r.status_code == 201, r.content
    return r.json()["ID"]


def both(broker, source_id: str, requests: list[tuple[bytes, dict]], *, native: bool = True):
    """(native answer, full stack answer) of two requests (one each way, the source held by this
    process before each); ``native``: whether the native route must have taken the first."""
    served, routes = broker
    answers = []
    for way, (body, headers) in zip(("native", "full"), requests):
        served.server.native = routes if way == "native" else None
        hold(source_id)
        handled = routes.handled
        answers.append(post(served, f"/in/{source_id}", body, {"Content-Type": "application/json", **headers}))
        assert (routes.handled - handled == 1) is (native and way == "native"), way
    served.server.native = routes
    assert shape(answers[0]) == shape(answers[1]), (answers[0].__dict__, answers[1].__dict__)
    return answers[0]


def hold(source_id: str) -> None:
    """This process holds the source and its channel's event types current (as it does while
    requests come): the native route takes the next request without a query."""
    source_lookup(source_id=source_id, fresh=True)
    channel_rules("ch1")


def stored(delivery: str) -> tuple:
    m = Message.objects.get(**{"headers__X-Broker-Source-Delivery": delivery})
    return bytes(m.payload), m.content_type, m.type, m.headers, m.producer.producer_id


def signed(body: bytes, delivery: str, **options) -> tuple[bytes, dict]:
    return body, github_headers(body, delivery=delivery, **options)


def test_an_accepted_request_and_its_redelivery_answer_as_the_full_stack(broker, make):
    source_id = source(make)
    body = b'{"ref": "refs/heads/main", "zen": "Keep it logically awesome."}'
    traceparent = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    answer = both(broker, source_id, [(body, {**github_headers(body, delivery="n-1"), **traceparent}),
                                      (body, {**github_headers(body, delivery="f-1"), **traceparent})])
    assert answer.status == 200 and answer.body == b"" and answer.header("Allow") == "POST, OPTIONS"
    assert answer.header("Content-Type") is None
    native, full = stored("n-1"), stored("f-1")
    assert native[:3] == full[:3] == (body, "application/json", "push") and native[4] == "broker-sources"
    assert native[3] == {"X-Broker-Source": "gh", "X-Broker-Source-Delivery": "n-1"}
    traces = [Message.objects.get(**{"headers__X-Broker-Source-Delivery": d}).traceparent.split("-")[1]
              for d in ("n-1", "f-1")]
    assert traces == ["0af7651916cd43dd8448eb211c80319c"] * 2
    # each delivery again, each way: accepted, nothing stored
    answer = both(broker, source_id, [signed(body, "n-1"), signed(body, "f-1")])
    assert answer.status == 200 and Message.objects.count() == 2
    source_tallies_flush()
    pk = Source.objects.get(source_id=source_id).pk
    assert source_counts(source_pks=[pk])[pk] == {"accepted": 2, "duplicate": 2}


def test_the_source_s_own_answer(broker, make):
    source_id = source(make, responseStatus="202", responseBody='{"ok": true}', responseContentType="application/json")
    answer = both(broker, source_id, [signed(b"{}", "n-1"), signed(b"{}", "f-1")])
    assert answer.status == 202 and answer.body == b'{"ok": true}'
    assert answer.header("Content-Type") == "application/json"
    source_id = source(make, "plain", responseBody="thanks")
    answer = both(broker, source_id, [signed(b"{}", "n-2"), signed(b"{}", "f-2")])
    assert answer.status == 200 and answer.body == b"thanks"
    assert answer.header("Content-Type") == "text/plain; charset=utf-8"


@pytest.mark.parametrize("headers,status,code", [
    ({"X-Hub-Signature-256": "sha256=" + "0" * 64, "X-GitHub-Delivery": "d-1"}, 401, "signature_invalid"),
    ({"X-GitHub-Delivery": "d-1"}, 401, "signature_missing"),
])
def test_a_refused_signature_goes_the_full_way(broker, make, headers, status, code):
    source_id = source(make)
    answer = both(broker, source_id, [(b"{}", headers), (b"{}", headers)], native=False)
    assert answer.status == status and json.loads(answer.body)["error"] == code
    assert not Message.objects.exists()


def test_an_unknown_or_disabled_source_goes_the_full_way(broker, make):
    unknown = "A" * 22
    answer = both(broker, unknown, [signed(b"{}", "d-1"), signed(b"{}", "d-1")], native=False)
    assert answer.status == 404 and json.loads(answer.body)["error"] == "source_not_found"
    source_id = source(make, enabled="false")
    answer = both(broker, source_id, [signed(b"{}", "d-1"), signed(b"{}", "d-1")], native=False)
    assert answer.status == 403 and json.loads(answer.body)["error"] == "source_disabled"
    assert not Message.objects.exists()


def test_slack_s_url_check_is_answered_on_the_loop(broker, make):
    source_id = source(make, "slack", verify="slack", secret=SLACK_SECRET)
    body = json.dumps({"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                       "type": "url_verification"}).encode()
    answer = both(broker, source_id, [(body, slack_headers(body, SLACK_SECRET)), (body, slack_headers(body, SLACK_SECRET))])
    assert answer.status == 200 and answer.header("Content-Type") == "application/json"
    assert json.loads(answer.body) == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    assert not Message.objects.exists()


def test_an_overloaded_broker_refuses_the_same_at_once(broker, make, monkeypatch):
    source_id = source(make)
    refusal = Unavailable("overloaded", "the broker is over its capacity: retry after 1 s", retry_after=1)
    monkeypatch.setattr(inbound_module, "publish_admission", lambda: refusal)
    monkeypatch.setattr("jobs.publish.grouped.publish_admission", lambda: refusal)
    answer = both(broker, source_id, [signed(b"{}", "n-1"), signed(b"{}", "f-1")])
    assert answer.status == 503 and answer.header("Retry-After") == "1"
    assert json.loads(answer.body)["error"] == "overloaded"
    assert not Message.objects.exists()


def test_copies_of_one_delivery_in_one_batch_publish_once(broker, make, settings):
    settings.BROKER_PUBLISH_ADMIT_WAIT = 0  # (admission would refuse the last of a burst on a busy machine: not tested here)
    served, routes = broker
    source_id = source(make)
    source_lookup(source_id=source_id)
    handled, batches = routes.handled, _publisher.batches
    copies = [(f'{{"n": {i}}}'.encode(), f"d-{i // 4}") for i in range(48)]  # 12 deliveries, 4 copies each

    def send(copy):
        hold(source_id)
        return post(served, f"/in/{source_id}", copy[0], github_headers(copy[0], delivery=copy[1])).status

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(send, copies))
    assert statuses == [200] * 48
    assert routes.handled - handled == 48 and _publisher.batches > batches
    assert sorted(Message.objects.values_list("headers__X-Broker-Source-Delivery", flat=True)) == sorted(
        f"d-{i}" for i in range(12))
    source_tallies_flush()
    pk = Source.objects.get(source_id=source_id).pk
    assert source_counts(source_pks=[pk])[pk] == {"accepted": 12, "duplicate": 36}


def test_a_publish_the_thread_refuses_is_answered_by_the_full_way(broker, make):
    """The source deleted after this process read it: the trigger refuses its message; the full way
    reads the source again and answers 404, as it does without the native route."""
    served, routes = broker
    source_id = source(make)
    hold(source_id)
    Source.objects.filter(source_id=source_id).delete()  # (not through the API: this process still holds it)
    handled = routes.handled
    body, headers = signed(b"{}", "d-1")
    answer = post(served, f"/in/{source_id}", body, headers)
    assert routes.handled - handled == 1  # taken on the loop, then answered by the full way
    assert answer.status == 404 and json.loads(answer.body)["error"] == "source_not_found"
    assert not Message.objects.exists()


def test_what_is_not_held_goes_the_full_way_and_is_read_again_in_the_pool(broker, make):
    """The loop never queries: a source or event types not held current go the full way (which reads
    them), and a request that finds them held but due has them read again in the server's pool."""
    served, routes = broker
    source_id = source(make)
    sources_cache_clear()
    validation.cache_clear()
    handled = routes.handled
    assert post(served, f"/in/{source_id}", *signed(b"{}", "d-1")).status == 200  # nothing held
    assert routes.handled == handled
    source_lookup(source_id=source_id, fresh=True)
    validation.cache_clear()  # the source held, its channel's event types not
    # (and not read in the pool while the loop looks: a warm pool thread could hold them first)
    current._asked.setdefault(routes, {})[("event types", "ch1")] = time.monotonic()
    assert post(served, f"/in/{source_id}", *signed(b"{}", "d-2")).status == 200
    assert routes.handled == handled  # the full way; it read them for this process, the pool too
    assert validation.channel_rules_held("ch1") is not None
    validation._cache.checked_at -= validation.CHECK_INTERVAL  # due: read again in the pool, answered meanwhile
    current._asked.clear()
    assert post(served, f"/in/{source_id}", *signed(b"{}", "d-3")).status == 200
    assert routes.handled == handled + 1
    deadline = time.monotonic() + 10
    while time.monotonic() - validation._cache.checked_at > validation.CHECK_INTERVAL:
        assert time.monotonic() < deadline, "the pool did not read the event types again"
        time.sleep(0.01)
    assert Message.objects.count() == 3
