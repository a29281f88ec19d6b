"""Schemathesis against the served OpenAPI schema, in-process over WSGI (test database).

Every operation is exercised with valid tokens (real ids of the ``world`` fixture), wrong tokens and
no tokens. Checks: no 5xx, status codes documented, content types and bodies match the schema.
Bounded (few examples per operation) so the whole module takes well under a minute.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from tests.conftest import ADMIN_TOKEN

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
schema.config.phases.update(phases=["examples", "fuzzing"])  # the coverage phase alone is thousands of cases

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
TOKEN_HEADERS = ("X-Broker-Admin-Token", "X-Broker-Channel-Token", "X-Broker-Consumer-Token",
                 "X-Broker-Producer-ID", "X-Broker-Producer-Token")
PULL_PATHS = ("/job", "/pull", "/ack", "/queued-jobs", "/unpin", "/advisories")


def _authorize(case, mode: str) -> None:
    headers = {k: v for k, v in (case.headers or {}).items() if k not in TOKEN_HEADERS}
    path = case.operation.path
    pull = any(p in path for p in PULL_PATHS)
    if mode == "valid":
        params = dict(case.path_parameters or {})
        if "channel_id" in params:
            params["channel_id"] = "ch1"
        if "consumer_id" in params:
            params["consumer_id"] = "c2" if pull else "c1"
        if "producer_id" in params:
            params["producer_id"] = "p1"
        case.path_parameters = params
        headers.update({"X-Broker-Admin-Token": ADMIN_TOKEN, "X-Broker-Channel-Token": "ch-token",
                        "X-Broker-Consumer-Token": "c2-token" if pull else "c-token",
                        "X-Broker-Producer-ID": "p1", "X-Broker-Producer-Token": "p-token"})
        if isinstance(case.body, dict):  # never a long-poll here: a pull would wait up to 60 s
            case.body = {k: v for k, v in case.body.items() if str(k).lower() != "expires"}
    elif mode == "wrong":
        headers.update({name: "wrong-token" for name in TOKEN_HEADERS})
    case.headers = headers


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["valid", "wrong", "none"])
@schema.parametrize()
@settings(max_examples=int(os.environ.get("BROKER_SCHEMATHESIS_EXAMPLES", "8")), deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_schema(case, mode, world, keep_test_connection):
    _authorize(case, mode)
    response = case.call()
    case.validate_response(response, checks=CHECKS)
