"""Schemathesis against the served OpenAPI schema, in-process over WSGI (test database).

Every operation is exercised with valid tokens (real ids of the ``world`` fixture and of the jobs,
partition and messages ``published`` adds), wrong tokens and no tokens. Checks: no 5xx, status codes
documented, content types and bodies match the schema; and with valid tokens, a request the schema
allows (positive generation) is not refused as bad input (400, 413, 415, 422), except for the rules
OpenAPI 3.0 cannot state (``UNSTATED``: across parameters, or on the state of the resource).
Bounded (few examples per operation, derandomized) so the whole module takes well under a minute.
"""

from __future__ import annotations

import os
import re

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from broker.xid import job_xid
from jobs.models import Job
from web.api.sources import NAME_SCHEMA
from tests.conftest import ADMIN_TOKEN

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
schema.config.phases.update(phases=["examples", "fuzzing"])  # the coverage phase alone is thousands of cases

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
TOKEN_HEADERS = ("X-Broker-Admin-Token", "X-Broker-Channel-Token", "X-Broker-Consumer-Token",
                 "X-Broker-Producer-ID", "X-Broker-Producer-Token")
PULL_PATHS = ("/job", "/pull", "/ack", "/queued-jobs", "/unpin", "/advisories")
SOURCE_NAME_SCHEMA = NAME_SCHEMA["pattern"]
REFUSED = (400, 413, 415, 422)  # a schema-valid request answered so: the schema and the route disagree


def _both(*names):
    return lambda case: all(name in (case.query or {}) for name in names)


# 400s for rules OpenAPI 3.0 cannot state: error code -> None (always such a rule) or when it is one.
UNSTATED = {
    "precondition_required": None,  # an update needs If-Unmodified-Since, a create does not
    "invalid_cursor": _both("next", "previous"),  # either cursor, not both
    "invalid_gate": lambda case: "X-Broker-Partition-Key" not in (case.headers or {}),  # a header needs another
    "partition_not_schedulable": None,  # X-Broker-Scheduled-For excludes X-Broker-Partition-Key
    "invalid_window": None,  # replay: until before since, or since after now
    "duplicate_job": None,  # an ack names a job twice
    "invalid_filter": None,  # a form field's JSON text
    # event types (issue 37): whether a schema is a valid JSON Schema, an example fits it, a document has webhooks
    "invalid_schema": None, "invalid_example": None, "invalid_document": None,
    # the state of the consumer or the job (answered 400 as webhook-broker does, not 409)
    "priority_policy_immutable": None, "group_missing": None, "invalid_group": None,
    "not_overflow_consumer": None, "not_pinned_consumer": None,
    "invalid_transition": None, "timeout_invalid_state": None, "job_not_dead": None,
    # a source name the schema's pattern refuses too (schemathesis' coverage phase has sent a blank
    # as a "valid" path segment): only then, so a valid name refused still fails
    "invalid_name": lambda case: not re.fullmatch(SOURCE_NAME_SCHEMA, (case.path_parameters or {}).get("source_name", "")),
    # a publish whose body the generator serialized as nothing (a form of an empty or non-object
    # value): the schema says at least one byte (minLength 1), and an empty body is refused as it says
    "empty_body": lambda case: not case.body,
}


@pytest.fixture
def published(world):
    """Messages m1 and m2 (partition k1), a scheduled message s1; the ID of c2's first job."""
    assert world.publish(**{"X-Broker-Message-ID": "m1"}).status_code == 201
    assert world.publish(**{"X-Broker-Message-ID": "m2", "X-Broker-Partition-Key": "k1"}).status_code == 201
    assert world.publish(**{"X-Broker-Message-ID": "s1",
                            "X-Broker-Scheduled-For": "2999-01-01T00:00:00Z"}).status_code == 201
    return job_xid(Job.objects.filter(consumer__consumer_id="c2").order_by("pk").values_list("pk", flat=True)[0])


def _authorize(case, mode: str, job_id: str | None = None) -> None:
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
        if "job_id" in params:
            params["job_id"] = job_id  # of c2: every job route is a pull consumer's
        if "key" in params:
            params["key"] = "k1"
        if "message_id" in params:
            params["message_id"] = "s1" if "scheduled" in path else "m1"
        case.path_parameters = params
        headers.update({"X-Broker-Admin-Token": ADMIN_TOKEN, "X-Broker-Channel-Token": "ch-token",
                        "X-Broker-Consumer-Token": "c2-token" if pull else "c-token",
                        "X-Broker-Producer-ID": "p1", "X-Broker-Producer-Token": "p-token"})
        # a publish's body is any bytes (``*/*``): schemathesis would send them with the first serializer
        # it has (a form), or has already picked the form serializer for ``*/*``, which encodes a
        # non-object body as nothing, multipart too (400 empty_body, CI runs of 2026-11-29): bytes go as bytes
        if case.media_type == "*/*" or (case.media_type in ("application/x-www-form-urlencoded", "multipart/form-data")
                                        and not isinstance(case.body, dict)):
            case.media_type = "application/octet-stream"
        if isinstance(case.body, dict):  # never a long-poll here: a pull would wait up to 60 s
            case.body = {k: v for k, v in case.body.items() if str(k).lower() != "expires"}
            if path.endswith("/dlq") and "requeue" in case.body:  # the DLQ requeue's token is a form field
                case.body["requeue"] = "c-token"
    elif mode == "wrong":
        headers.update({name: "wrong-token" for name in TOKEN_HEADERS})
    case.headers = headers


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["valid", "wrong", "none"])
@schema.parametrize()
@settings(max_examples=int(os.environ.get("BROKER_SCHEMATHESIS_EXAMPLES", "8")), deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_schema(case, mode, world, request):
    job_id = request.getfixturevalue("published") if mode == "valid" else None
    request.getfixturevalue("keep_test_connection")  # after the fixtures' requests: Django's test client reconnects
    _authorize(case, mode, job_id)
    response = case.call()
    case.validate_response(response, checks=CHECKS)
    if mode == "valid" and case.meta.generation.mode.is_positive and response.status_code in REFUSED:
        code = response.json().get("error")
        assert code in UNSTATED and (UNSTATED[code] is None or UNSTATED[code](case)), (
            f"a request the schema allows was refused: {response.status_code} {response.text}\n"
            f"{case.as_curl_command()}")
