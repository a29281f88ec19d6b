"""The counter fold (broker.counters.counters_compact, SQL broker_counterdelta_fold): a slot with
deltas is folded into the counters and emptied by TRUNCATE; an empty slot is left alone, so the
cached plans that read the deltas (the claims' counts) are not invalidated by an idle broker."""

from __future__ import annotations

import pytest
from django.db import connection

from broker.counters import counters_compact

pytestmark = pytest.mark.django_db(transaction=True)
SLOTS = ("broker_counterdelta_0", "broker_counterdelta_1")


def filenodes() -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT relname, pg_relation_filenode(oid) FROM pg_class WHERE relname = ANY(%s)", [list(SLOTS)])
        return dict(cur.fetchall())


def counter(owner_id: int) -> int | None:
    with connection.cursor() as cur:
        cur.execute("SELECT count FROM broker_counter WHERE scope = 1 AND owner_id = %s AND status = 1001", [owner_id])
        row = cur.fetchone()
        return None if row is None else row[0]


def test_an_empty_slot_is_not_truncated():
    with connection.cursor() as cur:
        cur.execute("TRUNCATE broker_counterdelta")  # both slots empty
    before = filenodes()
    assert counters_compact() == 0
    assert counters_compact() == 0
    assert filenodes() == before


def test_a_slot_with_deltas_is_folded_and_truncated():
    owner = 987654321
    with connection.cursor() as cur:
        cur.execute("TRUNCATE broker_counterdelta")
        # a delta in each slot: whichever the fold takes (the one not being written now) is folded
        cur.execute("INSERT INTO broker_counterdelta (scope, owner_id, status, delta, slot)"
                    " VALUES (1, %s, 1001, 5, 0), (1, %s, 1001, 5, 1)", [owner, owner])
    before = filenodes()
    assert counters_compact() == 1
    after = filenodes()
    assert sum(after[name] != before[name] for name in SLOTS) == 1  # the folded slot only
    assert counter(owner) == 5
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM broker_counterdelta WHERE owner_id = %s", [owner])
        assert cur.fetchone()[0] == 1  # the other slot's delta waits for its turn


def test_a_retention_run_that_removes_nothing_leaves_no_delta_to_fold():
    """The retention sweep runs every 5 s; its run counters (scope 26) go to the counter rows, so on
    an idle broker the fold finds nothing and truncates nothing (with deltas it did, every 5 s)."""
    from jobs.sweeps.retention import retention_run

    with connection.cursor() as cur:
        cur.execute("TRUNCATE broker_counterdelta")
        cur.execute("SELECT COALESCE(sum(count), 0) FROM broker_counter WHERE scope = 26 AND status = 1")
        runs = cur.fetchone()[0]
    retention_run(sweep_every=0)
    retention_run(sweep_every=0)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM broker_counterdelta")
        assert cur.fetchone()[0] == 0
        cur.execute("SELECT status, count FROM broker_counter WHERE scope = 26 ORDER BY status")
        rows = dict(cur.fetchall())
    assert rows[1] == runs + 2  # two runs counted
    assert sum(n for status, n in rows.items() if status not in (1, 199)) >= 2  # and their duration buckets
    before = filenodes()
    assert counters_compact() == 0
    assert filenodes() == before
