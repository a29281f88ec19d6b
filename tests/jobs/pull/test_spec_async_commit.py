"""The spec path's job state change commits asynchronously (jobs.pull.spec.job_move_spec): the statement sets
synchronous_commit off for its own transaction only, never for the connection's later ones."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test import Client

from broker.xid import job_pk
from jobs.pull.spec import job_move_spec
from jobs.state.transitions import INFLIGHT, QUEUED
from tests.jobs.pull.conftest import BASE, PULL_HEADERS, job_status, publish_n


def synchronous_commit() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        return cur.fetchone()[0]


def durable_session() -> None:
    """The test server runs with synchronous_commit off: this connection's session turns it on."""
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit = on")


def first_job() -> str:
    return Client().get(f"{BASE}/queued-jobs", **PULL_HEADERS).json()["Result"][0]["ID"]


@pytest.mark.django_db
def test_the_move_turns_synchronous_commit_off_for_its_transaction(world):
    publish_n(world, 1)
    job = first_job()
    durable_session()
    with transaction.atomic():
        assert synchronous_commit() == "on"
        row, moved, policy, _receipt = job_move_spec(
            channel_id="ch1", consumer_id="c2", job_id=job_pk(job), channel_token="ch-token",
            consumer_token="c2-token", from_statuses=[QUEUED], to_status=INFLIGHT, async_commit=True)
        assert moved and policy == "none" and row[7] == QUEUED
        assert synchronous_commit() == "off"  # until this transaction ends (SET LOCAL)
    assert job_status(job) == ("INFLIGHT", 0)


@pytest.mark.django_db(transaction=True)
def test_spec_path_moves_leave_the_connection_durable(world, settings):
    publish_n(world, 2)
    durable_session()
    for async_commit in (True, False):
        settings.BROKER_PULL_ASYNC_COMMIT = async_commit
        job = first_job()
        for state in ("INFLIGHT", "DELIVERED"):
            r = Client().generic("POST", f"{BASE}/job/{job}", json.dumps({"NextState": state}),
                                 content_type="application/json", **PULL_HEADERS)
            assert r.status_code == 202, r.content
            assert synchronous_commit() == "on"  # publishing on this connection stays durable
        assert job_status(job) == ("DELIVERED", 0)
