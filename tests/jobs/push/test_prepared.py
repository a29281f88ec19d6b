"""The push hot path runs prepared statements: the claim and the record are planned once per
connection, not at every dispatcher transaction (before issue 28 the push cursor left psycopg's
preparation off, and each transaction re-planned both: ~2.4 ms of database CPU)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from jobs.push.claim import PUSH_TRANSACTION_SETUP, jobs_claim_push
from jobs.push.delivery import Result, targets_load
from jobs.push.record import outcomes_record

pytestmark = pytest.mark.django_db(transaction=True)


def _prepared(fragment: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"%{fragment}%"])
        return cur.fetchone()[0]


def test_claim_and_record_are_prepared_on_the_connection(make):
    make.basics()
    make.consumer("c1")
    for i in range(3):
        assert make.publish(body=b'{"n": %d}' % i).status_code == 201
    connection.close()  # a dispatcher's own connection: nothing was prepared on it before its first claim
    for _ in range(2):  # two dispatcher transactions: a claim, then its outcome recorded
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(PUSH_TRANSACTION_SETUP)
            [job] = jobs_claim_push(limit=1, worker="w")
            target = targets_load({job.consumer_pk})[job.consumer_pk]
            result = Result(status_code=204, duration=0.01)
            result.finished = 0.0
            assert outcomes_record([(job, target, result)], now=0.0) == []
    # each prepared once and reused by the second transaction (pg_stat_statements counts no plans then)
    assert _prepared("WITH k AS MATERIALIZED") == 1  # the claim
    assert _prepared("pg_advisory_xact_lock") == 1
    assert _prepared("UPDATE jobs_job j SET") >= 1  # the record (push_record's CTE u)
