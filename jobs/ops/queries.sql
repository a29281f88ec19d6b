-- Named SQL of jobs.ops (format: broker.db.queries): dead-job and partition operator actions,
-- dashboard figures, the plan check.
-- Job statuses are literals (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition
-- AVAILABLE 1) wherever a generic plan must use a partial index: only a literal lets a plan (a
-- cached generic plan above all) use the partial indexes that hold one status (job_claim,
-- job_inflight_deadline, ...). History rows are written by the jobs_job trigger (migration 0017)
-- from ``last_reason``, which every status-changing UPDATE sets.

-- partition_write --
-- index: pk
-- The optimistic write every operator change of a partition is: the fields given (NULL leaves a
-- column as it is; none of them is nullable), if the row is still at %(version)s.
UPDATE jobs_partition SET
    gate = COALESCE(%(gate)s::int, gate),
    status = COALESCE(%(status)s::smallint, status),
    closed = COALESCE(%(closed)s::bool, closed),
    auto_close = COALESCE(%(auto_close)s::bool, auto_close),
    manual_checkpoint = COALESCE(%(manual_checkpoint)s::bool, manual_checkpoint),
    version = version + 1, updated_at = now()
 WHERE id = %(id)s AND version = %(version)s
RETURNING version;

-- partition_dead_jobs --
-- index: job_partition_gate
-- The DEAD jobs of a partition (partition retry).
SELECT id FROM jobs_job WHERE partition_id = %s AND status = 1004;

-- partition_gate_dead_jobs --
-- index: job_partition_gate
-- The DEAD jobs at a partition's gate (partition skip).
SELECT id FROM jobs_job WHERE partition_id = %s AND gate = %s AND status = 1004;

-- requeue_dead --
-- index: job_consumer_status
-- hot
-- settings: enable_bitmapscan=off, enable_sort=off
-- One batch of a consumer's DEAD jobs back to QUEUED with the retry count reset (DLQ, admin,
-- partition retry). Ranges on (consumer, status) so only job_consumer_status serves it. Its
-- settings keep the walk of that index in its order: for a consumer the statistics call small,
-- a custom plan otherwise fetched and sorted all its dead jobs (a bitmap scan), a cost that grows
-- with a DLQ built after the last ANALYZE (the same for delete_dead and purge_queued).
WITH c AS (
    SELECT id FROM jobs_job
     WHERE consumer_id BETWEEN %(consumer)s AND %(consumer)s AND status BETWEEN 1004 AND 1004
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (expires_at IS NULL OR expires_at > now())  -- expiry: an expired message stays dead
     ORDER BY consumer_id DESC, status DESC, id LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE jobs_job j SET status = %(queued)s, retry_count = 0, status_changed_at = now(),
                          next_attempt_at = now(), deadline = NULL, last_reason = %(reason)s
     WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status = %(dead)s  -- by primary key
    RETURNING j.id, j.partition_id
)
SELECT count(*), (SELECT pg_notify('broker_jobs', %(consumer)s::text) FROM u LIMIT 1),
       (SELECT array_agg(DISTINCT partition_id) FROM u WHERE partition_id IS NOT NULL) FROM u;

-- delete_dead --
-- index: job_consumer_status
-- hot
-- settings: enable_bitmapscan=off, enable_sort=off
-- One batch of a consumer's DEAD jobs deleted (DLQ delete, partition skip); the history trigger
-- writes DEAD -> GONE with %(reason)s (set for this statement).
WITH r AS (
    -- the history row's reason (the history trigger reads it for a delete, then clears it)
    SELECT set_config('broker.history_reason', %(reason)s, true) AS why
)
, c AS (
    SELECT id FROM jobs_job
     WHERE consumer_id BETWEEN %(consumer)s AND %(consumer)s AND status BETWEEN 1004 AND 1004
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
     ORDER BY consumer_id DESC, status DESC, id LIMIT %(limit)s  -- the index's order: no scan stops early
       FOR UPDATE SKIP LOCKED
)
-- by primary key only (an IN (...) let a plan hash every dead job of the table first)
DELETE FROM jobs_job WHERE id = ANY(ARRAY(SELECT id FROM c)) AND status + 0 = 1004
   AND (SELECT why FROM r) IS NOT NULL
RETURNING partition_id;

-- purge_queued --
-- index: job_claim
-- hot
-- settings: enable_bitmapscan=off, enable_sort=off
-- One batch of a consumer's QUEUED jobs deleted (a runaway backlog), optionally only older ones;
-- the history trigger writes QUEUED -> GONE, reason purged.
WITH r AS (
    -- the history row's reason (the history trigger reads it for a delete, then clears it)
    SELECT set_config('broker.history_reason', 'purged', true) AS why
), c AS (
    SELECT id FROM jobs_job
     WHERE consumer_id BETWEEN %(consumer)s AND %(consumer)s AND status = 1001
       AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s::timestamptz)
       AND (%(age)s::float8 IS NULL OR created_at < now() - %(age)s::float8 * interval '1 second')
     ORDER BY consumer_id, id LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), d AS (
    DELETE FROM jobs_job j WHERE j.id = ANY(ARRAY(SELECT id FROM c)) AND j.status = %(queued)s  -- by primary key
       AND (SELECT why FROM r) IS NOT NULL
    RETURNING j.id, j.retry_count, j.partition_id
)
SELECT count(*), (SELECT array_agg(DISTINCT partition_id) FROM d WHERE partition_id IS NOT NULL) FROM d;

-- mark_dead --
-- index: pk
-- hot
-- An operator gives up on jobs: QUEUED or INFLIGHT -> DEAD, rows locked in id order.
WITH c AS (
    SELECT id, status FROM jobs_job
     WHERE id = ANY(%(ids)s::bigint[]) AND status IN (%(queued)s, %(inflight)s)
       AND (%(consumer)s::bigint IS NULL OR consumer_id = %(consumer)s::bigint)
     ORDER BY id
       FOR UPDATE
), u AS (
    UPDATE jobs_job j SET status = %(dead)s, status_changed_at = now(), deadline = NULL,
                          last_reason = %(reason)s
      FROM c WHERE j.id = c.id AND j.status = c.status
    RETURNING j.id, c.status AS from_s, j.retry_count, j.partition_id
)
SELECT id, from_s, partition_id FROM u;

-- dead_id_batch --
-- index: job_consumer_status
-- The next batch of a consumer's dead job ids after %s, ascending (the requeue_dead command).
SELECT id FROM jobs_job WHERE consumer_id = %s AND status = %s AND id > %s
   AND (%s::bigint[] IS NULL OR id = ANY(%s::bigint[])) ORDER BY id LIMIT %s;

-- minute_stats --
-- index: pk
-- The last hour's per-minute statistics of some consumers (jobs_minutestat, summed over pids).
SELECT consumer_id,
       (extract(epoch FROM date_trunc('minute', now()) - minute) / 60)::int AS ago,
       sum(created), sum(delivered), sum(retried), sum(dead), sum(requeued)
  FROM jobs_minutestat
 WHERE minute > date_trunc('minute', now()) - %(window)s * interval '1 minute'
   AND consumer_id = ANY(%(ids)s::bigint[])
 GROUP BY 1, 2;

-- minute_stats_prune --
-- index: pk
-- Drop per-minute statistics older than three hours (also done now and then by the triggers).
SELECT jobs_minutestat_prune();

-- pin_changes --
-- index: advisory_consumer
-- Pins taken in the last hour per consumer, from the advisories.
SELECT consumer_pk, count(*) FROM consumers_advisory
 WHERE consumer_pk = ANY(%(ids)s::bigint[]) AND type = 'consumer_group_pinned'
   AND created_at > now() - interval '1 hour'
 GROUP BY consumer_pk;

-- oldest_queued --
-- index: job_claim
-- hot
-- The oldest QUEUED job of each consumer: one probe of job_claim (consumer, id; QUEUED only). A
-- range on the consumer, not an equality, keeps the sort key only that index provides: ordered by
-- id alone, a correlated probe walked the primary key over every other consumer's jobs (3.9 s per
-- dashboard at a 1M backlog).
SELECT c.id, extract(epoch FROM now() - (
           SELECT j.created_at FROM jobs_job j
            WHERE j.consumer_id BETWEEN c.id AND c.id AND j.status = 1001
            ORDER BY j.consumer_id, j.id LIMIT 1))
  FROM unnest(%(ids)s::bigint[]) AS c(id);

-- overdue_inflight --
-- index: job_inflight_deadline|job_inflight_consumer
-- hot
-- In-flight jobs past their deadline by more than a grace (capped): any means the sweep is not running.
SELECT count(*) FROM (
    SELECT 1 FROM jobs_job
     WHERE status = 1002 AND deadline < now() - %(grace)s * interval '1 second'
     LIMIT %(cap)s) x;

-- job_payload_head --
-- index: pk (jobs_job, then broker_message)
-- The admin's preview of a job's own payload (set by a handler-driven gate move): at most %s bytes,
-- its size, and its message's content type. Params: limit, id. No row when the job has none.
SELECT substring(j.payload FROM 1 FOR %s), octet_length(j.payload), m.content_type
  FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
 WHERE j.id = %s AND j.payload IS NOT NULL;

-- pull_waiting --
-- index: pullwaiter_live
-- hot
-- How many pulls of the consumer are waiting now.
SELECT count(*) FROM consumers_pullwaiter WHERE consumer_id = %s AND expires_at > now();

-- plan_sample_consumers --
-- index: none (every consumer: a registry-sized table; counters by counter_key)
-- The consumers the plan check explains with (jobs.ops.plans.sample_live): each one's type, channel,
-- whether it has priority groups, partitions or a doorbell, and its QUEUED count (the maintained
-- counters).
SELECT c.id, c.type, c.channel_id, ch.channel_id, c.consumer_id,
       c.priority_policy <> 'none',
       EXISTS (SELECT 1 FROM jobs_partition p WHERE p.consumer_id = c.id),
       c.type = 'pull' AND c.callback_url <> '',
       COALESCE((SELECT sum(x.n) FROM (
           SELECT count AS n FROM broker_counter WHERE scope = 1 AND owner_id = c.id AND status = 1001
           UNION ALL
           SELECT delta FROM broker_counterdelta WHERE scope = 1 AND owner_id = c.id AND status = 1001) x),
           0)::bigint
  FROM consumers_consumer c JOIN broker_channel ch ON ch.id = c.channel_id;

-- plan_sample_producer --
-- index: pk
-- Any producer (the plan check's publish statements need one's id).
SELECT id FROM broker_producer ORDER BY id LIMIT 1;

-- plan_sample_jobs --
-- index: job_claim, job_inflight_consumer, job_consumer_status
-- Some jobs of a consumer in a status (the plan check's samples), each status by its own index.
(SELECT id FROM jobs_job WHERE %(status)s = 1001 AND consumer_id = %(consumer)s AND status = 1001
  ORDER BY consumer_id DESC, id DESC LIMIT %(n)s)
UNION ALL
(SELECT id FROM jobs_job WHERE %(status)s = 1002 AND consumer_id = %(consumer)s AND status = 1002
  ORDER BY consumer_id, deadline LIMIT %(n)s)
UNION ALL
(SELECT id FROM jobs_job WHERE %(status)s >= 1003 AND consumer_id = %(consumer)s AND status >= 1003
   AND status = %(status)s ORDER BY consumer_id DESC, status DESC, id DESC LIMIT %(n)s);

-- plan_sample_partition --
-- index: partition_consumer_status
-- A partition of a consumer (the plan check's samples).
SELECT id FROM jobs_partition WHERE consumer_id = %(consumer)s LIMIT 1;

-- plan_watch_due --
-- index: none (two catalog rows and a one-row-per-statement table)
-- When jobs_job or broker_message was last analyzed (autovacuum or ANALYZE), and which analysis
-- the stored plan checks saw.
SELECT (SELECT max(GREATEST(last_autoanalyze, last_analyze)) FROM pg_stat_user_tables
         WHERE schemaname = current_schema() AND relname IN ('jobs_job', 'broker_message')),
       (SELECT max(analyzed_at) FROM jobs_plancheck);

-- plan_watch_lock --
-- index: none (an advisory lock)
-- One plan check at a time across the processes (for the rest of the transaction).
SELECT pg_try_advisory_xact_lock(hashtext('broker_plan_watch'));

-- plan_checks_store --
-- index: none (one row per checked statement)
-- The latest plan check of every statement (jobs.ops.plans.plan_results_store); statements no longer
-- checked are removed.
WITH v AS (
    SELECT * FROM unnest(%(cases)s::text[], %(modes)s::text[], %(indexes)s::text[], %(costs)s::float8[],
                         %(problems)s::text[]) AS v(statement, mode, indexes, cost, problems)
), gone AS (
    DELETE FROM jobs_plancheck p WHERE NOT EXISTS (
        SELECT 1 FROM v WHERE v.statement = p.statement AND v.mode = p.mode)
)
INSERT INTO jobs_plancheck (statement, mode, indexes, cost, problems, checked_at, analyzed_at)
SELECT statement, mode, indexes, cost, problems, now(), %(analyzed)s::timestamptz FROM v
ON CONFLICT (statement, mode) DO UPDATE SET indexes = EXCLUDED.indexes, cost = EXCLUDED.cost,
    problems = EXCLUDED.problems, checked_at = EXCLUDED.checked_at, analyzed_at = EXCLUDED.analyzed_at;

-- plan_regressions_count --
-- index: none (one row per checked statement)
-- Statements whose last checked plan left its index (/metrics broker_plan_regressions).
SELECT count(*) FROM jobs_plancheck WHERE problems <> '';

-- plan_tables --
-- index: none (catalog lookups)
-- The planner's row count of jobs_job (reltuples: what plans are made for), which of some index
-- names exist, and which of those index the big tables (the plan check: below a size only a
-- missing index counts; an index of a small table may rightly be skipped for a scan).
SELECT (SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobs_job'::regclass),
       (SELECT array_agg(i.relname::text) FROM pg_class i
         WHERE i.relkind = 'i' AND i.relname = ANY(%(names)s::text[])
           AND i.relnamespace = current_schema()::regnamespace),
       (SELECT array_agg(i.relname::text) FROM pg_class i JOIN pg_index x ON x.indexrelid = i.oid
         WHERE i.relname = ANY(%(names)s::text[]) AND i.relnamespace = current_schema()::regnamespace
           AND x.indrelid IN ('jobs_job'::regclass, 'broker_message'::regclass));

-- attempts_newest_id --
-- index: pk
-- The newest delivery attempt id, 0 without any (where a consumer's attempt pages start).
SELECT COALESCE(max(id), 0) FROM jobs_deliveryattempt;

-- consumer_attempts --
-- index: pk (jobs_deliveryattempt backwards over one window of ids; each row's job by its primary key)
-- One page of a consumer's delivery attempts, newest first, among the attempt ids in
-- [%(low)s, %(high)s), optionally of one outcome (the delivery portal's Deliveries page). Attempts have
-- no consumer column: the id window bounds what a page reads whatever the table's size, and each
-- row's job is looked up by its primary key (a scalar subquery: never a hash of the consumer's jobs).
SELECT a.id, a.job_id, a.attempt, a.started_at, a.duration_ms, a.status_code, a.outcome,
       left(a.error, %(head)s), left(a.response_excerpt, %(head)s)
  FROM jobs_deliveryattempt a
 WHERE a.id >= %(low)s AND a.id < %(high)s
   AND (%(outcome)s::text IS NULL OR a.outcome = %(outcome)s::text)
   AND (SELECT j.consumer_id FROM jobs_job j WHERE j.id = a.job_id) = %(consumer)s
 ORDER BY a.id DESC
 LIMIT %(limit)s;

-- consumer_attempt_figures --
-- index: pk (the newest %(scan)s attempt ids; each row's job by its primary key)
-- A consumer's attempts of the last hour and of the last day, read from the broker's newest
-- %(scan)s attempts (a bounded read whatever the table's size): for each window the attempts, the
-- deliveries and the p50 / p99 duration (ms); last, ``reach``: when the rows read do not cover the
-- whole day while older attempts exist, the start of the oldest of them (NULL: the day is covered).
WITH b AS (
    SELECT COALESCE(max(id), 0) - %(scan)s AS low FROM jobs_deliveryattempt
), w AS (
    SELECT a.started_at, a.duration_ms, a.outcome, a.job_id
      FROM jobs_deliveryattempt a WHERE a.id > (SELECT low FROM b)
), mine AS (
    SELECT w.duration_ms, w.outcome = 'delivered' AS ok, w.started_at > now() - interval '1 hour' AS recent
      FROM w
     WHERE w.started_at > now() - interval '1 day'
       AND (SELECT j.consumer_id FROM jobs_job j WHERE j.id = w.job_id) = %(consumer)s
)
SELECT count(*) FILTER (WHERE recent), count(*) FILTER (WHERE recent AND ok),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) FILTER (WHERE recent),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms) FILTER (WHERE recent),
       count(*), count(*) FILTER (WHERE ok),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms),
       CASE WHEN EXISTS (SELECT 1 FROM jobs_deliveryattempt x WHERE x.id <= (SELECT low FROM b))
            THEN (SELECT min(w.started_at) FROM w HAVING min(w.started_at) > now() - interval '1 day') END
  FROM mine;
