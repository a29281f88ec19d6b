"""The one transition table (jobs.state.transitions) and the one history writer (the jobs_job trigger):
pure checks without a database, then the database enforcing the same table and writing history
for every kind of status write, deletes included."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from broker.db.errors import IllegalTransition
from broker.db.run import query_execute
from broker.errors import Conflict
from jobs.models import Job, JobTransition
from jobs.ops.dead_jobs import jobs_delete_dead, jobs_mark_dead, jobs_purge_queued, jobs_requeue_dead
from jobs.pull.ack import jobs_ack_inflight
from jobs.pull.claim import jobs_claim
from jobs.state.transitions import ALLOWED, DEAD, DELIVERED, GONE, INFLIGHT, KINDS, QUEUED, transition_check
from tests.jobs.moves import Move, jobs_move

STATUSES = (QUEUED, INFLIGHT, DELIVERED, DEAD, GONE)


# --- pure rules (no database) -----------------------------------------------------------------------

def test_every_pair_outside_the_table_is_refused():
    for a in STATUSES:
        for b in STATUSES:
            if (a, b) in ALLOWED:
                transition_check(a, b)
            else:
                with pytest.raises(IllegalTransition):
                    transition_check(a, b)


def test_delivered_leaves_only_by_a_replay_and_gone_is_never_left():
    assert not {b for a, b in ALLOWED if a == GONE}
    assert {b for a, b in ALLOWED if a == DELIVERED} == {QUEUED}
    assert KINDS[(DELIVERED, QUEUED)] == {"replay"}
    transition_check(QUEUED, DEAD, "expired")  # expiry (jobs.sweeps.message_expiry)
    transition_check(DEAD, QUEUED, "replay")
    assert not {a for a, b in ALLOWED if b == a}


def test_a_move_must_be_of_its_kind():
    transition_check(INFLIGHT, QUEUED, "timeout")
    transition_check(QUEUED, DEAD, "mark_dead")
    with pytest.raises(IllegalTransition, match="claim"):
        transition_check(INFLIGHT, DELIVERED, "claim")
    with pytest.raises(IllegalTransition):
        transition_check(QUEUED, DEAD, "timeout")  # a sweep never kills a queued job
    assert {b for (a, b), kinds in KINDS.items() if a == INFLIGHT and "retry" in kinds} == {QUEUED, DEAD}


def test_illegal_transition_is_a_conflict_with_a_code():
    err = IllegalTransition("x")
    assert isinstance(err, Conflict) and err.code == "illegal_transition"


def test_guarded_writers_refuse_before_sql():
    with pytest.raises(IllegalTransition):  # no database access: raised before any statement
        jobs_move(moves=[Move(job_id=1, from_status=DELIVERED, to_status=DEAD)], reason="x")
    with pytest.raises(IllegalTransition):
        jobs_ack_inflight(consumer_pk=1, job_ids=[1], to_statuses=[INFLIGHT], delays=[None], max_retry=1)


# --- the database enforces the same table and writes the history --------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_database_allows_exactly_the_python_table(world):
    """Every (from, to) pair of statuses, tried as a raw UPDATE (and every status as a delete with a
    reason) against the history trigger: it passes exactly the pairs of jobs.state.transitions."""
    job = _jobs(world, 1)[0]
    seen = set()
    for a in (QUEUED, INFLIGHT, DELIVERED, DEAD):
        for b in (QUEUED, INFLIGHT, DELIVERED, DEAD, GONE):
            if a == b:
                continue
            with connection.cursor() as cur:  # put the job in status a, around the trigger
                cur.execute("ALTER TABLE jobs_job DISABLE TRIGGER jobs_job_history_upd")
                cur.execute("UPDATE jobs_job SET status = %s WHERE id = %s", [a, job.pk])
                cur.execute("ALTER TABLE jobs_job ENABLE TRIGGER jobs_job_history_upd")
            try:
                with transaction.atomic():
                    if b == GONE:
                        query_execute("SELECT set_config('broker.history_reason', 'probe', true)")
                        query_execute("DELETE FROM jobs_job WHERE id = %s", [job.pk])
                    else:
                        query_execute("UPDATE jobs_job SET status = %s WHERE id = %s", [b, job.pk])
                    seen.add((a, b))
                    raise _Undo
            except _Undo:
                pass
            except IllegalTransition:
                pass
    assert seen == set(ALLOWED)


class _Undo(Exception):
    """Roll a probe back."""


def _jobs(world, n=3, consumer="c2"):
    for i in range(n):
        assert world.publish(HTTP_X_BROKER_MESSAGE_ID=f"t{i}").status_code == 201
    return list(Job.objects.filter(consumer__consumer_id=consumer).order_by("id"))


def _history(job_id):
    return list(JobTransition.objects.filter(job_id=job_id).order_by("id")
                .values_list("from_status", "to_status", "retry_count", "reason"))


@pytest.mark.django_db(transaction=True)
def test_raw_sql_cannot_make_an_illegal_move(world):
    job = _jobs(world, 1)[0]
    with pytest.raises(IllegalTransition, match="1001 -> 1003"):
        query_execute("UPDATE jobs_job SET status = 1003 WHERE id = %s", [job.pk])
    with pytest.raises(IllegalTransition):  # the guarded Python path fails the same way
        jobs_move(moves=[Move(job_id=job.pk, from_status=QUEUED, to_status=DELIVERED)], reason="x")
    job.refresh_from_db()
    assert job.status == QUEUED and _history(job.pk) == []


@pytest.mark.django_db(transaction=True)
def test_raw_sql_legal_move_gets_its_history_row(world):
    job = _jobs(world, 1)[0]
    query_execute("UPDATE jobs_job SET status = 1002, last_reason = 'raw' WHERE id = %s", [job.pk])
    query_execute("UPDATE jobs_job SET deadline = now() WHERE id = %s", [job.pk])  # no status change: no row
    assert _history(job.pk) == [(QUEUED, INFLIGHT, 0, "raw")]


@pytest.mark.django_db(transaction=True)
def test_every_writer_leaves_one_history_row_per_move(world):
    jobs = _jobs(world, 3)
    pk = jobs[0].consumer_id
    claimed = jobs_claim(consumer_pk=pk, limit=3, reason="pull")
    assert len(claimed) == 3
    ids = [j.id for j in claimed]
    out = jobs_ack_inflight(consumer_pk=pk, job_ids=ids, to_statuses=[DELIVERED, DEAD, QUEUED],
                                  delays=[None, None, 0], max_retry=5, reason="pull-ack")
    assert {k: v[0] for k, v in out.items()} == {i: True for i in ids}
    assert _history(ids[0]) == [(QUEUED, INFLIGHT, 0, "pull"), (INFLIGHT, DELIVERED, 0, "pull-ack")]
    assert _history(ids[1]) == [(QUEUED, INFLIGHT, 0, "pull"), (INFLIGHT, DEAD, 0, "pull-ack")]
    assert _history(ids[2]) == [(QUEUED, INFLIGHT, 0, "pull"), (INFLIGHT, QUEUED, 1, "pull-ack")]
    assert jobs_mark_dead(job_ids=[ids[2]], reason="operator") == {ids[2]: QUEUED}
    assert jobs_requeue_dead(consumer_pk=pk, job_ids=[ids[2]], reason="dlq-requeue") == 1
    assert _history(ids[2])[-2:] == [(QUEUED, DEAD, 1, "operator"), (DEAD, QUEUED, 0, "dlq-requeue")]
    # deletes: the dead-job delete writes its row now, like the purge
    assert jobs_delete_dead(consumer_pk=pk, job_ids=[ids[1]]) == 1
    assert _history(ids[1])[-1] == (DEAD, GONE, 0, "deleted")
    assert jobs_purge_queued(consumer_pk=pk) == 1
    assert _history(ids[2])[-1] == (QUEUED, GONE, 0, "purged")


@pytest.mark.django_db(transaction=True)
def test_a_delete_without_a_reason_writes_no_history_and_the_reason_lasts_one_statement(world):
    jobs = _jobs(world, 3)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('broker.history_reason', 'why', true)")
            cur.execute("DELETE FROM jobs_job WHERE id = %s", [jobs[0].pk])
            cur.execute("DELETE FROM jobs_job WHERE id = %s", [jobs[1].pk])  # reason used up
    Job.objects.filter(pk=jobs[2].pk).delete()  # ORM / cascade delete: no reason
    assert _history(jobs[0].pk) == [(QUEUED, GONE, 0, "why")]
    assert _history(jobs[1].pk) == [] and _history(jobs[2].pk) == []


@pytest.mark.django_db(transaction=True)
def test_a_delete_with_a_reason_of_a_job_that_may_not_go_is_refused(world):
    job = _jobs(world, 1)[0]
    jobs_claim(consumer_pk=job.consumer_id, limit=1)
    with pytest.raises(IllegalTransition, match="1002 -> 0"):
        with transaction.atomic():
            query_execute("SELECT set_config('broker.history_reason', 'why', true)")
            query_execute("DELETE FROM jobs_job WHERE id = %s", [job.pk])
    assert Job.objects.filter(pk=job.pk).exists()
