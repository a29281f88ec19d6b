-- Named SQL of jobs.sweeps (format: broker.db.queries): the in-flight timeout sweep and the
-- message expiry sweep.
-- Job statuses are literals (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition
-- AVAILABLE 1) wherever a generic plan must use a partial index: only a literal lets a plan (a
-- cached generic plan above all) use the partial indexes that hold one status (job_claim,
-- job_inflight_deadline, ...). History rows are written by the jobs_job trigger (migration 0017)
-- from ``last_reason``, which every status-changing UPDATE sets.

-- expire_inflight --
-- index: job_inflight_deadline|job_inflight_consumer
-- hot
-- The timeout sweep: one batch of expired INFLIGHT jobs (all consumers', or %(consumer)s's: a pull's
-- lazy sweep) back to QUEUED (retry + 1), DEAD past the consumer's retry limit; waiting pulls are
-- notified. No ORDER BY: every call requeues every expired job (in batches), and either in-flight
-- index finds them without a sort. Run with its values (Django binds them), the consumer test folds
-- away: job_inflight_deadline for all consumers, job_inflight_consumer for one.
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1002 AND j.deadline < now()
       AND (%(consumer)s::bigint IS NULL OR j.consumer_id = %(consumer)s::bigint)
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), u AS (
    -- by primary key only (``+ 0``; a join with c hashed every in-flight job per batch: 100,000
    -- expired jobs took 99 s at a 1M backlog); the consumer's retry limit per row
    UPDATE jobs_job j SET
        status = CASE WHEN j.retry_count + 1 > COALESCE(
                          (SELECT k.max_retry FROM consumers_consumer k WHERE k.id = j.consumer_id), %(max_retry)s)
                      THEN 1004 ELSE 1001 END,
        retry_count = j.retry_count + 1,
        status_changed_at = now(),
        next_attempt_at = now(),
        deadline = NULL,
        last_reason = 'timeout'
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status + 0 = 1002
    RETURNING j.id, j.status, j.retry_count, j.consumer_id, j.partition_id
), n AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ','))
      FROM u WHERE status = 1001 HAVING count(*) > 0
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n),
       (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL AND status = 1004);

-- expire_messages --
-- index: job_queued_expiry
-- hot
-- Expiry sweep (jobs.sweeps.message_expiry): one batch of QUEUED jobs whose message expired -> DEAD, reason
-- ``expired`` (history by the trigger). job_queued_expiry is partial (QUEUED rows with an expiry, by
-- expires_at), so a sweep that finds nothing costs one index probe however large the backlog. Rows
-- locked SKIP LOCKED (a claim in progress cannot pick an expired row anyway) and moved by primary
-- key (``+ 0`` keeps the status check on the row, as in expire_inflight).
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1001 AND j.expires_at IS NOT NULL AND j.expires_at <= now()
     ORDER BY j.expires_at
     LIMIT %(limit)s::int
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = 1004, status_changed_at = now(), deadline = NULL, last_reason = 'expired'
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status + 0 = 1001
    RETURNING j.id, j.partition_id
)
SELECT count(*), (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL) FROM u;

-- expired_status --
-- index: pk
-- The status of this job if its message has expired (no row: not expired, or no such job). Asked
-- only after a move was refused, to answer 409 message_expired.
SELECT status FROM jobs_job WHERE id = %(job)s AND expires_at <= now();
