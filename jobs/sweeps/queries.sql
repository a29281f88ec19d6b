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
-- away: job_inflight_deadline for all consumers, job_inflight_consumer for one. The walk starts at
-- %(since)s (jobs.state.floors: the last complete sweep's clock less its lag; NULL: a full walk),
-- and returns this one's, so a held snapshot's dead entries are not walked at every sweep.
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1002 AND j.deadline < now()
       AND j.deadline >= COALESCE(%(since)s::timestamptz, '-infinity'::timestamptz)
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
       (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL AND status = 1004),
       now() - %(lag)s::float8 * interval '1 second';

-- expire_messages --
-- index: job_queued_expiry
-- hot
-- Expiry sweep (jobs.sweeps.message_expiry): one batch of QUEUED jobs whose message expired -> DEAD, reason
-- ``expired`` (history by the trigger). job_queued_expiry is partial (QUEUED rows with an expiry, by
-- expires_at), so a sweep that finds nothing costs one index probe however large the backlog. Rows
-- locked SKIP LOCKED (a claim in progress cannot pick an expired row anyway) and moved by primary
-- key (``+ 0`` keeps the status check on the row, as in expire_inflight). From %(since)s, as
-- expire_inflight (a job put back to QUEUED with an older expiry waits for the next full walk: no
-- claim hands it out meanwhile).
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1001 AND j.expires_at IS NOT NULL AND j.expires_at <= now()
       AND j.expires_at >= COALESCE(%(since)s::timestamptz, '-infinity'::timestamptz)
     ORDER BY j.expires_at
     LIMIT %(limit)s::int
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = 1004, status_changed_at = now(), deadline = NULL, last_reason = 'expired'
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status + 0 = 1001
    RETURNING j.id, j.partition_id
)
SELECT count(*), (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL),
       now() - %(lag)s::float8 * interval '1 second' FROM u;

-- expired_status --
-- index: pk
-- The status of this job if its message has expired (no row: not expired, or no such job). Asked
-- only after a move was refused, to answer 409 message_expired.
SELECT status FROM jobs_job WHERE id = %(job)s AND expires_at <= now();

-- retention_lock --
-- index: none (an advisory lock)
-- One retention sweep at a time per database (every dispatcher loop and the maintenance task call
-- it; the others return at once). Session-level: held across the sweep's statements, each its own
-- transaction, and released by retention_unlock (or with the connection).
SELECT pg_try_advisory_lock(hashtext('broker_retention'));

-- retention_unlock --
-- index: none (an advisory lock)
-- The sweep is done (retention_lock).
SELECT pg_advisory_unlock(hashtext('broker_retention'));

-- retention_channels --
-- index: message_channel_received
-- hot
-- Every channel with the retention in force (its own, else %(retention)s seconds), its cursor, and
-- whether its tip has work: a message past the window after the tip (one probe of
-- message_channel_received per channel, which starts after what was already removed: no walk over
-- dead index entries). The database clock comes back with them. Channels are few; no message
-- table is read whole.
SELECT c.id, w.secs, k.tip_at, k.tip_id, k.sweep_at, k.sweep_id, k.sweep_started_at,
       (SELECT 1 FROM broker_message m
         WHERE m.channel_id BETWEEN c.id AND c.id
           AND (m.received_at, m.id) > (COALESCE(k.tip_at, '-infinity'::timestamptz), COALESCE(k.tip_id, 0))
           AND m.received_at < now() - make_interval(secs => w.secs)
         ORDER BY m.channel_id, m.received_at, m.id LIMIT 1) IS NOT NULL AS due,
       now()
  FROM broker_channel c
 CROSS JOIN LATERAL (SELECT COALESCE(c.retention, %(retention)s::int)::float8 AS secs) w
  LEFT JOIN jobs_retentioncursor k ON k.channel_id = c.id
 ORDER BY c.id;

-- retention_batch --
-- index: message_channel_received, job_unique_per_consumer, broker_message_pkey, jobs_jobtransition_job_id_4c64a2d7, jobs_deliveryattempt_job_id_e4685361
-- hot
-- settings: enable_seqscan=off, enable_sort=off
-- One batch of the retention sweep (jobs.sweeps.retention) in one channel: the next %(limit)s
-- messages after (%(after_at)s, %(after_id)s) and up to (%(until_at)s, %(until_id)s) in
-- message_channel_received's order that are older than %(retention)s seconds are examined; each one
-- whose jobs are all finished (DELIVERED, or DEAD for %(dead_retention)s seconds and not holding
-- back a FAILED partition at its gate) is removed with its jobs, their history and attempts.
-- Never a message with a QUEUED or INFLIGHT job, even against a concurrent replay or requeue: the
-- message and its jobs are locked (SKIP LOCKED: a row someone holds is skipped, never waited for),
-- the finished test reads the locked (latest) row versions, and a message goes only when every job
-- the statement's snapshot holds was locked unchanged (same status and status_changed_at: no history
-- row or attempt can have been added that this statement would not see). A replay holds its
-- messages FOR KEY SHARE (replay_chunk), so it never adds a job to a message being removed. The
-- deletes write no history (broker.history_reason is cleared: the jobs_job trigger then writes
-- none) and remove the jobs' history instead; the counter triggers keep the job and message counts
-- right, and the rows removed are added to the retention counters (scopes 24 and 25; 30: jobs per
-- UTC day of publication, the ledger that tells the Spark reports which days lost rows). Returns the
-- messages examined, the last one's keyset (the cursor), and the four counts removed. Every table
-- is read through an index, by message or by job; enable_seqscan=off keeps it so for the history
-- and attempt tables whatever their statistics say (analyzed while small, a plan read them whole),
-- and enable_sort=off keeps the batch on message_channel_received's order (fresh statistics once
-- led a custom plan to message_received and a sort of every old message).
WITH r AS (
    SELECT set_config('broker.history_reason', '', true) AS why
), cand AS MATERIALIZED (
    -- a range on channel_id keeps it in the sort keys: only message_channel_received gives this order
    SELECT m.id, m.received_at FROM broker_message m
     WHERE m.channel_id BETWEEN %(channel)s::bigint AND %(channel)s::bigint
       AND (m.received_at, m.id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
       AND (m.received_at, m.id) <= (%(until_at)s::timestamptz, %(until_id)s::bigint)
       AND m.received_at < now() - make_interval(secs => %(retention)s::float8)
     ORDER BY m.channel_id, m.received_at, m.id
     LIMIT %(limit)s::int
), msg AS MATERIALIZED (
    SELECT m.id FROM broker_message m WHERE m.id = ANY(ARRAY(SELECT id FROM cand)) FOR UPDATE SKIP LOCKED
), seen AS MATERIALIZED (
    -- every job of those messages as the statement's snapshot holds it (no lock)
    SELECT j.id, j.message_id, j.status, j.status_changed_at FROM jobs_job j
     WHERE j.message_id = ANY(ARRAY(SELECT id FROM msg))
), jl AS MATERIALIZED (
    -- the same jobs locked: the latest committed version of each, or none when someone holds it
    SELECT j.id, j.message_id, j.consumer_id, j.status, j.status_changed_at, j.partition_id, j.gate
      FROM jobs_job j
     WHERE j.message_id = ANY(ARRAY(SELECT id FROM msg))
       FOR UPDATE SKIP LOCKED
), held AS (
    -- messages to keep: a job skipped, changed since the snapshot, or not finished
    SELECT DISTINCT s.message_id FROM seen s LEFT JOIN jl ON jl.id = s.id
     WHERE jl.id IS NULL OR jl.status <> s.status OR jl.status_changed_at <> s.status_changed_at
        OR NOT (jl.status = 1003
                OR (jl.status = 1004
                    AND jl.status_changed_at < now() - make_interval(secs => %(dead_retention)s::float8)
                    -- a probe by primary key (as NOT EXISTS it became a join over every FAILED partition)
                    AND (jl.partition_id IS NULL
                         OR (SELECT 1 FROM jobs_partition p
                              WHERE p.id = jl.partition_id AND p.status = 2 AND p.gate = jl.gate) IS NULL)))
), ok AS MATERIALIZED (
    SELECT msg.id FROM msg WHERE NOT EXISTS (SELECT 1 FROM held WHERE held.message_id = msg.id)
), dj AS (
    -- by primary key; the history trigger finds broker.history_reason empty and writes nothing
    DELETE FROM jobs_job j
     WHERE j.id = ANY(ARRAY(SELECT jl.id FROM jl JOIN ok ON ok.id = jl.message_id))
       AND (SELECT why FROM r) IS NOT NULL
    RETURNING j.id, j.consumer_id, j.message_id
), dt AS (
    DELETE FROM jobs_jobtransition t WHERE t.job_id = ANY(ARRAY(SELECT id FROM dj)) RETURNING t.job_id
), da AS (
    DELETE FROM jobs_deliveryattempt a WHERE a.job_id = ANY(ARRAY(SELECT id FROM dj)) RETURNING a.job_id
), dm AS (
    DELETE FROM broker_message m WHERE m.id = ANY(ARRAY(SELECT id FROM ok)) RETURNING m.id, m.received_at
), n AS (
    SELECT (SELECT count(*) FROM dm) AS messages, (SELECT count(*) FROM dj) AS jobs,
           (SELECT count(*) FROM dt) AS transitions, (SELECT count(*) FROM da) AS attempts
), per_job AS (
    SELECT dj.consumer_id, 2 AS what, 1::bigint AS k FROM dj
    UNION ALL SELECT dj.consumer_id, 3, 1 FROM dt JOIN dj ON dj.id = dt.job_id
    UNION ALL SELECT dj.consumer_id, 4, 1 FROM da JOIN dj ON dj.id = da.job_id
), c AS (
    INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
    SELECT 25, consumer_id, what, sum(k) FROM per_job GROUP BY consumer_id, what
    UNION ALL
    SELECT 24, %(channel)s::bigint, v.what, v.k FROM n
     CROSS JOIN LATERAL (VALUES (1, n.messages), (2, n.jobs), (3, n.transitions), (4, n.attempts)) v(what, k)
     WHERE v.k > 0
    UNION ALL
    -- the ledger of the Spark reports (scope 30): jobs removed per UTC day of publication
    SELECT 30, %(channel)s::bigint, (dm.received_at AT TIME ZONE 'UTC')::date - DATE '2000-01-01', count(*)
      FROM dj JOIN dm ON dm.id = dj.message_id GROUP BY 3
    RETURNING 1
), last AS (
    SELECT received_at, id FROM cand ORDER BY received_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM cand), (SELECT received_at FROM last), (SELECT id FROM last),
       n.messages, n.jobs, n.transitions, n.attempts, (SELECT count(*) FROM c)
  FROM n;

-- retention_cursor_save --
-- index: pk
-- Where the retention sweep stands in one channel (jobs_retentioncursor, one row per channel).
INSERT INTO jobs_retentioncursor (channel_id, tip_at, tip_id, sweep_at, sweep_id, sweep_started_at)
VALUES (%(channel)s, %(tip_at)s, %(tip_id)s, %(sweep_at)s, %(sweep_id)s, %(sweep_started_at)s)
ON CONFLICT (channel_id) DO UPDATE SET
    tip_at = EXCLUDED.tip_at, tip_id = EXCLUDED.tip_id, sweep_at = EXCLUDED.sweep_at,
    sweep_id = EXCLUDED.sweep_id, sweep_started_at = EXCLUDED.sweep_started_at;

-- retention_run_record --
-- index: pk
-- The sweep's last run (one row) and its run counters: a run, its duration's histogram bucket
-- (%(bucket)s) and the duration in microseconds (scope 26, owner 0), added to the counter rows
-- themselves, not as deltas: one sweep runs at a time (its advisory lock), so nothing contends for
-- them, and a delta every 5 s made the counter fold TRUNCATE its slot every 5 s on an idle broker,
-- which invalidated every cached plan that reads the deltas (the claims were planned again at 0.4
-- of their calls). In the fold's order (scope, owner, status).
WITH last AS (
    INSERT INTO jobs_retentionrun (id, started_at, seconds, removed, batches)
    VALUES (1, now() - make_interval(secs => %(seconds)s::float8), %(seconds)s, %(removed)s, %(batches)s)
    ON CONFLICT (id) DO UPDATE SET started_at = EXCLUDED.started_at, seconds = EXCLUDED.seconds,
                                   removed = EXCLUDED.removed, batches = EXCLUDED.batches
    RETURNING 1
)
INSERT INTO broker_counter (scope, owner_id, status, count)
SELECT 26, 0, v.status, sum(v.delta) FROM last
 CROSS JOIN (VALUES (1, 1::bigint), (%(bucket)s::int, 1), (199, %(micros)s::bigint)) v(status, delta)
 GROUP BY v.status ORDER BY v.status
    ON CONFLICT (scope, owner_id, status) DO UPDATE SET count = broker_counter.count + EXCLUDED.count;

-- retention_last_run --
-- index: pk
-- The sweep's last run: when it started, how long it took, the rows it removed (none: never ran).
SELECT started_at, seconds, removed FROM jobs_retentionrun WHERE id = 1;

-- oldest_messages --
-- index: message_channel_received
-- hot
-- The oldest stored message of each channel (the footprint): its received_at and age in seconds, by
-- the first entry of message_channel_received per channel. The sweep removes from that end, so the
-- entries it left are skipped until a vacuum (autovacuum keeps them few: jobs migration 0021).
SELECT id, at, extract(epoch FROM now() - at)::float8 FROM (
    SELECT c.id, (SELECT m.received_at FROM broker_message m WHERE m.channel_id BETWEEN c.id AND c.id
                   ORDER BY m.channel_id, m.received_at, m.id LIMIT 1) AS at
      FROM unnest(%(ids)s::bigint[]) AS c(id)) x;

-- oldest_consumer_messages --
-- index: job_claim, job_inflight_consumer|job_inflight_deadline, job_consumer_status
-- hot
-- The message of each consumer's oldest stored job (its lowest id in any status): its received_at
-- and age in seconds. One probe per status, each of its own index: QUEUED job_claim (consumer, id),
-- in flight the consumer's in-flight jobs (job_inflight_consumer: at most its maxAckPending),
-- DELIVERED and DEAD a backward probe of job_consumer_status (ranges, not equalities, keep the sort
-- keys only those indexes provide, as in oldest_queued); then the message by primary key.
SELECT id, at, extract(epoch FROM now() - at)::float8 FROM (
    SELECT c.id, (SELECT m.received_at FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
                   WHERE j.id = LEAST(
                       (SELECT k.id FROM jobs_job k WHERE k.consumer_id BETWEEN c.id AND c.id AND k.status = 1001
                         ORDER BY k.consumer_id, k.id LIMIT 1),
                       -- (+ 0: not min() as a walk of the primary key over every other job)
                       (SELECT min(k.id + 0) FROM jobs_job k WHERE k.consumer_id = c.id AND k.status = 1002),
                       (SELECT min(f.id) FROM (VALUES (1003), (1004)) s(status)
                         CROSS JOIN LATERAL (
                             SELECT k.id FROM jobs_job k
                              WHERE k.consumer_id BETWEEN c.id AND c.id
                                AND k.status BETWEEN s.status AND s.status AND k.status >= 1003
                              ORDER BY k.consumer_id DESC, k.status DESC, k.id LIMIT 1) f))) AS at
      FROM unnest(%(ids)s::bigint[]) AS c(id)) x;

-- consumer_retention --
-- index: pk
-- The retention in force for a consumer's channel (its own, else %(retention)s seconds).
SELECT COALESCE(ch.retention, %(retention)s::int) FROM consumers_consumer c
  JOIN broker_channel ch ON ch.id = c.channel_id WHERE c.id = %(consumer)s;

-- orphans_requeue --
-- index: pk, job_inflight_deadline
-- Push claims of dispatchers that are gone (jobs.sweeps.orphans): each jobs_pushowner row whose
-- backend is no longer in pg_stat_activity (the same pid and start; another role's sessions show
-- no start) is removed, and the push jobs it held INFLIGHT go back to QUEUED at once, without
-- spending a retry (the attempt's outcome is unknown: at-least-once delivers it again), reason
-- ``orphaned``; waiting loops are notified. With %(legacy)s also the push claims without an owner
-- (made by a release before jobs_job.claimed_by, e.g. during a rolling upgrade), once no push
-- dispatcher without an owner row is connected (no ``broker-push-listen`` backend of this
-- database that is not registered); only push consumers' jobs (a pull claim has no owner either).
-- Each walk of the in-flight jobs runs only when it can find something (one-time filters), and is
-- bounded by what is in flight. Returns (jobs moved, -1 while an ownerless dispatcher is still
-- connected else 0, their consumers).
WITH gone AS (
    DELETE FROM jobs_pushowner o
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                        WHERE a.pid = o.pid AND (a.backend_start IS NULL OR a.backend_start = o.backend_start))
    RETURNING o.id
), alive AS (
    SELECT count(*) AS n FROM pg_stat_activity a
     WHERE %(legacy)s::boolean AND a.application_name = 'broker-push-listen' AND a.datname = current_database()
       AND NOT EXISTS (SELECT 1 FROM jobs_pushowner o WHERE o.pid = a.pid)
), owned AS (
    SELECT j.id FROM jobs_job j
     WHERE (SELECT count(*) FROM gone) > 0
       AND j.status = 1002 AND j.claimed_by = ANY(ARRAY(SELECT id FROM gone))
       FOR UPDATE SKIP LOCKED
), ownerless AS (
    SELECT j.id FROM jobs_job j JOIN consumers_consumer k ON k.id = j.consumer_id AND k.type = 'push'
     WHERE %(legacy)s::boolean AND (SELECT n FROM alive) = 0
       AND j.status = 1002 AND j.claimed_by IS NULL
       FOR UPDATE OF j SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = 1001, status_changed_at = now(), next_attempt_at = now(), deadline = NULL,
                          last_reason = 'orphaned'
     WHERE j.id = ANY(ARRAY(SELECT id FROM owned UNION ALL SELECT id FROM ownerless)) AND j.status + 0 = 1002
    RETURNING j.id, j.consumer_id
), n AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ',')) FROM u HAVING count(*) > 0
)
SELECT (SELECT count(*) FROM u), CASE WHEN (SELECT n FROM alive) > 0 THEN -1 ELSE 0 END + (SELECT count(*) FROM n) * 0,
       COALESCE((SELECT array_agg(DISTINCT consumer_id) FROM u), '{}'::bigint[]);
