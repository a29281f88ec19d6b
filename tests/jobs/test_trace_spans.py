"""OpenTelemetry spans (issue 25 part 2), configured through the standard OTEL_* variables and
exported over OTLP/HTTP to a real collector stand-in on 127.0.0.1: publish, each push delivery
attempt (with its HTTP status) and pull claim / ack, all in the message's trace, and the callback's
traceparent naming its attempt's span. The SDK is set up once per process (broker.tracing), so this
module's one test owns the exporter's endpoint."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from jobs.models import Job, JobStatus
from tests.helpers import QuietHandler, serve_loopback, wait_until
from tests.jobs.conftest import Reply
from tests.jobs.pull.conftest import PullClient

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


class Collector:
    """Decodes every OTLP/HTTP export (protobuf) into (trace id, span id, parent id, name, attributes)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(QuietHandler):
            def do_POST(self):
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with collector.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                collector.spans.append({
                                    "trace": span.trace_id.hex(), "span": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(), "name": span.name,
                                    "attributes": {a.key: (a.value.int_value or a.value.string_value)
                                                   for a in span.attributes}})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server, self.thread = serve_loopback(Handler)

    def named(self, prefix: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


@pytest.fixture
def collector(monkeypatch, settings):
    c = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{c.server.server_address[1]}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s
    settings.OTEL_TRACING = True
    yield c
    c.server.shutdown()
    c.server.server_close()


@pytest.mark.django_db(transaction=True)
def test_spans_for_publish_attempts_and_pull_in_the_messages_trace(collector, make, receiver, dispatcher, client_anon):
    make.basics().consumer("c1", callback=receiver.url("/cb"), retryBackoff="0.1", maxRetry="5")
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    receiver.behave("/cb", lambda n, req: Reply(503 if n == 1 else 204))
    assert make.publish(HTTP_X_BROKER_MESSAGE_ID="s1", HTTP_TRACEPARENT=PARENT).status_code == 201
    dispatcher()
    receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 1, what="the push delivery")
    pc = PullClient(client_anon)
    [job] = pc.pull(batch=1).json()["Result"]
    assert pc.ack([{"ID": job["ID"], "NextState": "DELIVERED"}]).status_code in (200, 202)
    wait_until(lambda: len(collector.named("deliver")) == 2 and collector.named("pull ack"), 10, "spans exported")

    [publish] = collector.named("publish ch1")
    assert publish["trace"] == TRACE and publish["parent"] == "00f067aa0ba902b7"  # the producer's span
    attempts = collector.named("deliver")
    assert all(a["trace"] == TRACE and a["parent"] == publish["span"] for a in attempts)
    assert sorted(a["attributes"]["http.response.status_code"] for a in attempts) == [204, 503]
    sent = [r.headers["traceparent"].split("-")[2] for r in receiver.at("/cb")]
    assert sorted(sent) == sorted(a["span"] for a in attempts)  # each callback names its attempt's span
    [claim] = collector.named("pull claim")
    [ack] = collector.named("pull ack")
    assert claim["trace"] == ack["trace"] == TRACE
    assert job["Message"]["Headers"]["traceparent"].split("-")[2] == claim["span"]  # the consumer's parent
