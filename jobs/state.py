"""The job state machine: every write of ``jobs_job.status`` goes through the modules named below,
and each checks its moves against the one transition table (``jobs/transitions.py``) before any
SQL; the database enforces the same table, and its trigger on ``jobs_job`` (migration 0017) is the
one writer of the history (``jobs_jobtransition``), from the ``last_reason`` each UPDATE sets.

Every move is one conditional UPDATE guarded by the expected status, so two actors can never both
win. Hot paths (claim, ack, sweep) are single batched statements over ``unnest`` arrays rather than
ORM loops: measured on this machine, batched raw claims/acks run ~40k jobs/s versus ~0.4k/s per-job
ORM. Time always comes from the database (``now()``), never from a worker's clock. The SQL is in
``jobs/queries.sql``.

By concern:
    jobs.transitions       the table (pure), IllegalTransition
    jobs.retries           deadlines and backoff (pure)
    jobs.claims            pull claims, deadline extensions
    jobs.acks              pull outcomes: the spec path's move, the batch ack
    jobs.push.claims       the push claim and the record of push attempts (with the circuit breaker)
    jobs.pull_moves        the spec path's move committed asynchronously
    jobs.sweeps            the timeout sweep
    jobs.expiry            the expiry sweep (QUEUED -> DEAD, kind ``expired``)
    jobs.replay_moves      a replay's chunk (DELIVERED / DEAD -> QUEUED, kind ``replay``)
    jobs.operator_actions  requeue / delete dead jobs, purge queued ones, mark dead
    jobs.gates             handler-driven gate moves of partitioned jobs
    jobs.moves             the generic batched move (tests, tools)

This module re-exports their names, so ``from jobs import state; state.jobs_claim(...)`` keeps working.
"""

from broker.db.errors import IllegalTransition
from broker.db.run import PLAN_CACHE_MODE, connection_plan_setup
from jobs.acks import job_move_pull_authenticated_grouped, jobs_ack_inflight
from jobs.claims import ClaimedJob, claimed_jobs, jobs_claim, jobs_claim_within_bytes, jobs_extend
from jobs.gates import GateMove, jobs_move_gate
from jobs.moves import Move, job_move, jobs_move
from jobs.operator_actions import PURGED, jobs_delete_dead, jobs_mark_dead, jobs_purge_queued, jobs_requeue_dead
from jobs.push.claims import (PUSH_CLAIM_LOCK, PUSH_TRANSACTION_SETUP, CircuitTally, PushJob, PushOutcome,
                              jobs_claim_push, jobs_push_record)
from jobs.replay_moves import REPLAY_MOVES, ReplayChunk, jobs_replay_chunk
from jobs.retries import backoff_delay, inflight_timeout, max_retry_for, stop_timeout
from jobs.sweeps import EXPIRE_BATCH, EXPIRE_BUDGET, jobs_expire_inflight
from jobs.transitions import ALLOWED, DEAD, DELIVERED, GONE, INFLIGHT, QUEUED, transition_check, transitions_check

__all__ = [
    "ALLOWED", "DEAD", "DELIVERED", "EXPIRE_BATCH", "EXPIRE_BUDGET", "GONE", "INFLIGHT", "PLAN_CACHE_MODE",
    "PURGED", "PUSH_CLAIM_LOCK", "PUSH_TRANSACTION_SETUP", "QUEUED", "REPLAY_MOVES", "CircuitTally", "ClaimedJob", "GateMove", "IllegalTransition",
    "Move", "PushJob", "PushOutcome", "ReplayChunk", "backoff_delay", "claimed_jobs", "connection_plan_setup",
    "inflight_timeout", "job_move", "job_move_pull_authenticated_grouped", "jobs_ack_inflight", "jobs_claim",
    "jobs_claim_push", "jobs_claim_within_bytes", "jobs_delete_dead", "jobs_expire_inflight", "jobs_extend",
    "jobs_mark_dead", "jobs_move", "jobs_move_gate", "jobs_purge_queued", "jobs_push_record", "jobs_replay_chunk",
    "jobs_requeue_dead",
    "max_retry_for", "stop_timeout", "transition_check", "transitions_check",
]
