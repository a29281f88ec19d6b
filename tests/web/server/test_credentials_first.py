"""Issue 38: every route that takes a body checks the credentials before it reads the body, so an
anonymous client cannot make the broker read megabytes. Each operation of the OpenAPI schema with a
request body is sent without credentials, declaring a 512 KiB body and ``Expect: 100-continue``: the
web server sends ``100 Continue`` only when the application starts reading the body, so a refusal
that comes without it was decided before any of the body was read."""

from __future__ import annotations

import re

import pytest
from django.core.wsgi import get_wsgi_application
from drf_spectacular.generators import SchemaGenerator

from tests.web.server.conftest import Reader

pytestmark = pytest.mark.django_db(transaction=True)
# Operations whose credential is in the body itself (webhook-broker's API): the body must be read.
CREDENTIAL_IN_BODY = {("POST", "/channel/{channel_id}/consumer/{consumer_id}/dlq")}
PULL_ROUTES = ("/job/", "/pull", "/ack", "/queued-jobs", "/unpin")
DECLARED = 512 * 1024  # above what is read with the head (BODY_PREREAD), under every route's limit


def operations_with_a_body() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                found.append((method.upper(), path))
    return sorted(found)


def concrete(path: str) -> str:
    consumer = "c2" if any(part in path for part in PULL_ROUTES) else "c1"
    values = {"channel_id": "ch1", "consumer_id": consumer, "producer_id": "p1", "job_id": "0", "key": "k",
              "message_id": "m"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)


def test_the_schema_lists_the_routes_that_take_a_body():
    found = set(operations_with_a_body())
    assert {("POST", "/channel/{channel_id}/broadcast"), ("PUT", "/channel/{channel_id}"),
            ("POST", "/channel/{channel_id}/consumer/{consumer_id}/ack")} <= found
    assert CREDENTIAL_IN_BODY <= found


def test_no_route_reads_a_body_before_the_credentials(make, serve):
    make.basics()
    make.consumer("c1")
    make.consumer("c2", type="pull", token="c2-token", callback=None)
    served = serve(get_wsgi_application())
    try:
        read_first = []
        for method, path in operations_with_a_body():
            if (method, path) in CREDENTIAL_IN_BODY:
                continue
            sock = served.connect()
            try:
                sock.sendall((f"{method} {concrete(path)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              f"Content-Type: application/json\r\nContent-Length: {DECLARED}\r\n"
                              "Expect: 100-continue\r\n\r\n").encode())
                answer = Reader(sock).response()
            finally:
                sock.close()
            if answer.status == 100:  # (a route open to anyone, the sample receiver, may answer 2xx: unread)
                read_first.append(f"{method} {path}: {answer.status}")
        assert not read_first, "routes that read the body before refusing the credentials:\n" + "\n".join(read_first)
    finally:
        served.close_pool_connections()
