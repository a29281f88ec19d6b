-- Named SQL of the consumers app (format: broker.db.queries). Statements the ORM cannot write:
-- locking reads, bulk deletes in one transaction, timestamps from the database clock.

-- consumer_lock_unmodified --
-- index: pk
-- Lock a consumer row if its Last-Modified (to the second) is still the caller's If-Unmodified-Since.
SELECT id FROM consumers_consumer WHERE id = %s
   AND date_trunc('second', updated_at) = to_timestamp(%s) FOR UPDATE;

-- consumer_jobs_delete --
-- index: job_claim, job_inflight_consumer, job_consumer_status
-- A deleted consumer's jobs (no history reason is set: like a cascade, they leave no history rows),
-- found by the index of each state (the jobs_job indexes hold the states they serve).
DELETE FROM jobs_job WHERE id IN (
    SELECT id FROM jobs_job WHERE consumer_id = %(consumer)s AND status = 1001
    UNION ALL SELECT id FROM jobs_job WHERE consumer_id = %(consumer)s AND status = 1002
    UNION ALL SELECT id FROM jobs_job WHERE consumer_id = %(consumer)s AND status >= 1003);

-- consumer_waiters_delete --
-- index: pullwaiter_live
-- A deleted consumer's waiting pulls.
DELETE FROM consumers_pullwaiter WHERE consumer_id = %s;

-- consumer_delete --
-- index: pk
-- The consumer row itself (after its jobs and waiters).
DELETE FROM consumers_consumer WHERE id = %s;

-- consumer_rotate_secret --
-- index: pk
-- A new signing secret; the old one stays valid for a grace period. updated_at moves forward by at
-- least a second, so Last-Modified always changes.
UPDATE consumers_consumer SET previous_signing_secret = signing_secret,
       previous_secret_expires_at = now() + %s * interval '1 second',
       signing_secret = %s,
       updated_at = GREATEST(now(), date_trunc('second', updated_at) + interval '1 second')
 WHERE id = %s;

-- consumer_pause --
-- index: pk
-- Pause or resume a consumer (flow control); updated_at as in consumer_rotate_secret.
UPDATE consumers_consumer SET paused = %s,
       updated_at = GREATEST(now(), date_trunc('second', updated_at) + interval '1 second')
 WHERE id = %s RETURNING updated_at;

-- consumer_notify --
-- index: none (no table)
-- Wake a resumed consumer's waiting pulls and the push dispatchers (on commit).
SELECT pg_notify('broker_jobs', %s);

-- pull_waiters_live --
-- index: none (a scrape reads every live waiter; the table holds only pulls waiting now)
-- Live waiting pulls per consumer, for /metrics (rows of every web process). A waiter's row is
-- deleted when its pull ends, and pruned soon after it expires when its process died.
SELECT consumer_id, count(*) FROM consumers_pullwaiter WHERE expires_at > now() GROUP BY consumer_id;
