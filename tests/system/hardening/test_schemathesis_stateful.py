"""Schemathesis stateful run (issue 25 part 4): sequences that follow the OpenAPI links from the
registry PUTs (a channel, a producer, a consumer created with schema-generated fields) to the
operations that need the created resource, in-process over WSGI against the test database.

Checks: ``not_a_server_error`` and response-schema conformance on every call. Because the PUT
schemas carry the parsers' real bounds (web/api/put_schemas.py), most generated PUTs are accepted:
the test asserts that the channel and producer PUTs are, and that the links were followed
(operations reached with an id a PUT created). Bounded to stay well under a minute.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.internal.conjecture import providers
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.conftest import ADMIN_TOKEN

PUTS = ("channel_update", "producer_update", "channel_consumer_update")
LINKED = ("channel_retrieve", "producer_retrieve", "channel_consumer_retrieve", "channel_consumers_retrieve",
          "channel_consumer_destroy", "channel_consumer_pause_create", "channel_consumer_replay_create",
          "channel_consumer_circuit_close_create", "channel_broadcast_create")  # a few targets: short runs
CHECKS = [not_a_server_error, response_schema_conformance]

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application()).include(
    operation_id=[*PUTS, *LINKED])
outcomes: Counter = Counter()  # (operationId, status class)
created: set = set()  # request paths a PUT answered 200
followed: Counter = Counter()  # operationId reached on a path a PUT created
errors: Counter = Counter()  # error codes of refused consumer PUTs


class Workflow(schema.as_state_machine()):
    """Each scenario starts from the same database (a savepoint rolled back at its end), so the
    responses, and the links they feed, are the same when Hypothesis replays a scenario."""

    def setup(self):
        self.savepoint = transaction.savepoint()
        created.clear()

    def teardown(self):
        transaction.savepoint_rollback(self.savepoint)

    def before_call(self, case):
        case.headers = {**(case.headers or {}), "X-Broker-Admin-Token": ADMIN_TOKEN,
                        "X-Broker-Channel-Token": "ch-token", "X-Broker-Producer-ID": "p1",
                        "X-Broker-Producer-Token": "p-token"}

    def after_call(self, response, case):
        op = case.operation.definition.raw.get("operationId")
        path = case.formatted_path
        outcomes[(op, response.status_code // 100)] += 1
        if op == "channel_consumer_update" and response.status_code >= 400:
            errors[response.json().get("error")] += 1
        if op in PUTS and response.status_code == 200:
            created.add(path)
        elif any(path.startswith(p + "/") or path == p for p in created):
            followed[op] += 1

    def validate_response(self, response, case, additional_checks=None, **kwargs):
        case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)


@pytest.fixture
def schema_only_data(monkeypatch):
    """Data drawn from the schema alone: Hypothesis also draws the string and number literals of every
    project module it has seen (``_get_local_constants``), so any new literal anywhere in the code
    changed this derandomized run, and with it whether three link targets were reached."""
    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants())
    providers.CONSTANTS_CACHE.cache.clear()  # what earlier tests of the session drew from them
    yield
    providers.CONSTANTS_CACHE.cache.clear()


@pytest.mark.django_db
def test_stateful_links_from_the_puts(world, keep_test_connection, settings, schema_only_data):
    settings.BROKER_CALLBACK_DENY_PRIVATE = False  # generated callback hosts: no DNS lookups here
    outcomes.clear(), created.clear(), followed.clear(), errors.clear()
    Workflow.run(settings=hypothesis_settings(
        max_examples=int(os.environ.get("BROKER_SCHEMATHESIS_STATEFUL_EXAMPLES", "25")), stateful_step_count=6,
        deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)))
    print(sorted(outcomes.items()), sorted(followed.items()), errors)
    for put in ("channel_update", "producer_update"):
        ok, refused = outcomes[(put, 2)], outcomes[(put, 4)]
        assert ok > 0 and ok >= 3 * refused, (put, ok, refused)  # the schema says what the API accepts
    assert sum(followed.values()) > 0 and len(followed) >= 3, followed  # the links lead somewhere


# --- what the PUT schemas allow, the API accepts -------------------------------------------------

def _put_cases(operation_id: str, path_parameters: dict):
    operation = schema.find_operation_by_id(operation_id)
    return operation.as_strategy(path_parameters=path_parameters, media_type="application/json")


ACCEPTED: Counter = Counter()


@pytest.mark.django_db
@pytest.mark.parametrize("operation_id, params", [
    ("channel_update", {}), ("producer_update", {}), ("channel_consumer_update", {"channel_id": "ch1"})])
def test_generated_put_bodies_are_accepted(world, keep_test_connection, settings, operation_id, params):
    """Schema-valid bodies (positive generation, JSON) for new resources: most answer 200. What is
    left are rules OpenAPI 3.0 cannot state (content-filter key names: given as propertyNames,
    which not every generator reads; an update's If-Unmodified-Since)."""
    settings.BROKER_CALLBACK_DENY_PRIVATE = False
    ACCEPTED.clear()
    refused: Counter = Counter()

    ids = itertools.count()

    @hypothesis_settings(max_examples=40, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))
    @given(case=_put_cases(operation_id, params))
    def put(case):
        key = {"channel_update": "channel_id", "producer_update": "producer_id"}.get(operation_id, "consumer_id")
        case.path_parameters = {**(case.path_parameters or {}), **params, key: f"gen-{next(ids)}"}  # always a create
        case.headers = {**(case.headers or {}), "X-Broker-Admin-Token": ADMIN_TOKEN}
        response = case.call()
        case.validate_response(response, checks=CHECKS)
        ACCEPTED[response.status_code] += 1
        if response.status_code != 200:
            refused[f"{response.json().get('error')}: {response.json().get('detail')}"] += 1

    put()
    # content-filter key names and a filter's JSON text are the rules OpenAPI 3.0 cannot state: a
    # refusal for them (invalid_filter) says nothing about the other fields, so it is set aside
    unstated = sum(n for reason, n in refused.items() if reason.startswith("invalid_filter:"))
    total = sum(ACCEPTED.values()) - unstated
    assert total >= 20 and ACCEPTED[200] >= 0.75 * total, (ACCEPTED, refused)
