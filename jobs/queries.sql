-- Named SQL of the jobs app (broker.db.queries: `-- name --`, `-- index: ...`, `-- hot`, doc lines).
-- Every statement is written out in full: no SQL is assembled in Python. Job statuses are literals
-- (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition AVAILABLE 1) wherever a
-- generic plan must use a partial index. History rows are written by the jobs_job trigger
-- (migration 0017) from ``last_reason``, which every status-changing UPDATE sets.
--
-- Why statuses are literals: only a literal lets a plan (a cached generic plan above all) use the
-- partial indexes that hold one status (job_claim, job_inflight_deadline, ...). Bound, the pull
-- claim's generic plan fetched every QUEUED job of the consumer through job_consumer_status and
-- sorted them (833 ms per pull + ack at a 1M backlog).
--
-- Partition gating in the claims (jobs.partitions): a partitioned job is claimable only at its
-- partition's current gate while the partition is AVAILABLE (push: also leased by the claiming
-- worker); on an ``ordered`` consumer only the lowest-id unfinished job of the partition, and none
-- while another is in flight. Non-partitioned jobs pay one ``partition_id IS NULL`` test (the claims
-- keep using job_claim; the subqueries run for partitioned rows only, and the partition test is a
-- correlated scalar subquery by primary key: as an EXISTS PostgreSQL may turn it into a hashed
-- subplan that reads every AVAILABLE partition per claim). The same predicate is written out in
-- claim_pull, claim_pull_bytes and both branches of claim_push.

-- move --
-- index: pk
-- The generic batched move (tests, tools): many transitions in one UPDATE ... FROM unnest, each
-- guarded by its expected status (and the consumer); moves to QUEUED past max_retry go DEAD.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(from_s)s::smallint[], %(to_s)s::smallint[],
                         %(retry_inc)s::int[], %(delay)s::float8[], %(timeout)s::float8[],
                         %(inc)s::float8[], %(max_retry)s::int[], %(reset)s::bool[])
           AS v(id, from_s, to_s, retry_inc, delay, timeout, inc, max_retry, reset)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = %(queued)s AND v.max_retry IS NOT NULL
                           AND j.retry_count + v.retry_inc > v.max_retry
                      THEN %(dead)s ELSE v.to_s END,
        retry_count = CASE WHEN v.reset THEN 0 ELSE j.retry_count + v.retry_inc END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.delay IS NULL THEN j.next_attempt_at
                               ELSE now() + v.delay * interval '1 second' END,
        deadline = CASE WHEN v.to_s = %(inflight)s THEN now() + v.timeout * interval '1 second' END,
        incremental_timeout = COALESCE(v.inc, j.incremental_timeout),
        last_reason = %(reason)s
      FROM v
     WHERE j.id = v.id AND j.status + 0 = v.from_s  -- by primary key only (+ 0: no other index)
       AND (%(consumer)s::bigint IS NULL OR j.consumer_id + 0 = %(consumer)s::bigint)
    RETURNING j.id, v.from_s, j.status, j.retry_count, j.deadline, j.partition_id
)
SELECT id, status, retry_count, deadline, partition_id FROM u;

-- claim_pull --
-- index: job_claim
-- hot
-- Claim up to %(limit)s due QUEUED jobs of one pull consumer, priority then oldest first, within
-- its room (not paused, maxAckPending from the maintained counters), partitioned jobs only at their
-- partition's gate; SKIP LOCKED picks, the UPDATE by primary key (= ANY(ARRAY(...)): a join with
-- picked hashed every job in the generic plan) moves them to INFLIGHT. Statuses are literals so a
-- generic plan can use the partial indexes.
-- Two limits: a literal bound inside (1000 = jobs.pull_fast.PULL_BATCH_MAX, the most one pull
-- claims), the consumer's room outside. A LIMIT the planner cannot read (a parameter, a subquery) is
-- estimated at 10 % of the rows: with one consumer owning a 1M backlog that is ~100,000 rows, and a
-- sequential scan plus a sort looked cheaper than this index walk (issue 21). The outer LIMIT pulls
-- only as many rows as the room allows, so only those are locked.
WITH picked AS (
    SELECT b.id FROM (
    SELECT j.id FROM jobs_job j
     WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.next_attempt_at <= now()
       AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry: never hand out an expired message
       AND (j.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
            AND pt.status = 1) = j.gate
        AND NOT ((SELECT k.ordered FROM consumers_consumer k WHERE k.id = j.consumer_id) AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
               AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))
     ORDER BY j.priority DESC, j.id
     LIMIT 1000  -- bound: jobs.pull_fast.PULL_BATCH_MAX
       FOR UPDATE SKIP LOCKED
    ) b
     LIMIT (SELECT CASE WHEN k.paused THEN 0 ELSE GREATEST(0, LEAST(%(limit)s::bigint,
            k.max_ack_pending - COALESCE((SELECT sum(x.n) FROM (
                SELECT count AS n FROM broker_counter
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002
                UNION ALL
                SELECT delta FROM broker_counterdelta
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002) x), 0)))::bigint END
          FROM consumers_consumer k WHERE k.id = %(consumer)s::bigint)
),
u AS (
    UPDATE jobs_job j SET
        status = 1002,
        status_changed_at = now(),
        deadline = now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, j.incremental_timeout)) * interval '1 second',
        incremental_timeout = COALESCE(%(inc)s::float8, j.incremental_timeout),
        last_reason = %(reason)s::text
     WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = 1001
    RETURNING j.id, j.message_id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
              j.partition_id, j.gate, j.payload
)
SELECT u.id, u.priority, u.retry_count, u.incremental_timeout, u.deadline,
       m.message_id, COALESCE(u.payload, m.payload), m.content_type, m.headers,
       CASE WHEN u.partition_id IS NOT NULL
            THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type
  FROM u JOIN broker_message m ON m.id = u.message_id
 ORDER BY u.priority DESC, u.id;

-- claim_pull_bytes --
-- index: job_claim
-- hot
-- claim_pull cut before the payloads add up to more than %(max_bytes)s (always at least one job).
-- The same two limits as claim_pull (a literal bound inside, the room outside).
WITH c AS (
    SELECT b.id, b.priority, b.message_id, b.payload FROM (
    SELECT j.id, j.priority, j.message_id, j.payload FROM jobs_job j
     WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.next_attempt_at <= now()
       AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry: never hand out an expired message
       AND (j.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
            AND pt.status = 1) = j.gate
        AND NOT ((SELECT k.ordered FROM consumers_consumer k WHERE k.id = j.consumer_id) AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
               AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))
     ORDER BY j.priority DESC, j.id
     LIMIT 1000  -- bound: jobs.pull_fast.PULL_BATCH_MAX
       FOR UPDATE SKIP LOCKED
    ) b
     LIMIT (SELECT CASE WHEN k.paused THEN 0 ELSE GREATEST(0, LEAST(%(limit)s::bigint,
            k.max_ack_pending - COALESCE((SELECT sum(x.n) FROM (
                SELECT count AS n FROM broker_counter
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002
                UNION ALL
                SELECT delta FROM broker_counterdelta
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002) x), 0)))::bigint END
          FROM consumers_consumer k WHERE k.id = %(consumer)s::bigint)
), s AS (
    -- payload sizes by primary key (a join let a plan hash the whole message table)
    SELECT c.id,
           row_number() OVER w AS n,
           sum(COALESCE(octet_length(c.payload),
                        (SELECT octet_length(m.payload) FROM broker_message m WHERE m.id = c.message_id))) OVER w
               AS running
      FROM c
    WINDOW w AS (ORDER BY c.priority DESC, c.id)
), picked AS (
    SELECT id FROM s WHERE n = 1 OR running <= %(max_bytes)s::bigint
),
u AS (
    UPDATE jobs_job j SET
        status = 1002,
        status_changed_at = now(),
        deadline = now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, j.incremental_timeout)) * interval '1 second',
        incremental_timeout = COALESCE(%(inc)s::float8, j.incremental_timeout),
        last_reason = %(reason)s::text
     WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = 1001
    RETURNING j.id, j.message_id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
              j.partition_id, j.gate, j.payload
)
SELECT u.id, u.priority, u.retry_count, u.incremental_timeout, u.deadline,
       m.message_id, COALESCE(u.payload, m.payload), m.content_type, m.headers,
       CASE WHEN u.partition_id IS NOT NULL
            THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type
  FROM u JOIN broker_message m ON m.id = u.message_id
 ORDER BY u.priority DESC, u.id;

-- expire_all --
-- index: job_inflight_deadline|job_inflight_consumer
-- hot
-- The timeout sweep over all consumers: one batch of expired INFLIGHT jobs back to QUEUED
-- (retry + 1), DEAD past the consumer's retry limit; waiting pulls are notified. No ORDER BY: every
-- call requeues every expired job, and either in-flight index finds them without a sort.
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1002 AND j.deadline < now()
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

-- expire_consumer --
-- index: job_inflight_consumer
-- hot
-- expire_all for one consumer (a pull's lazy sweep), oldest deadline first.
WITH c AS (
    SELECT j.id FROM jobs_job j
     WHERE j.status = 1002 AND j.deadline < now() AND j.consumer_id = %(consumer)s ORDER BY j.deadline
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
-- index: job_consumer_status
-- hot
-- settings: enable_bitmapscan=off, enable_sort=off
-- One batch of a consumer's QUEUED jobs deleted (a runaway backlog), optionally only older ones;
-- the history trigger writes QUEUED -> GONE, reason purged.
WITH r AS (
    -- the history row's reason (the history trigger reads it for a delete, then clears it)
    SELECT set_config('broker.history_reason', 'purged', true) AS why
), c AS (
    SELECT id FROM jobs_job
     WHERE consumer_id BETWEEN %(consumer)s AND %(consumer)s AND status BETWEEN 1001 AND 1001
       AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s::timestamptz)
       AND (%(age)s::float8 IS NULL OR created_at < now() - %(age)s::float8 * interval '1 second')
     ORDER BY consumer_id DESC, status DESC, id LIMIT %(limit)s
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

-- extend --
-- index: pk
-- hot
-- Push the deadline of a pull consumer's in-flight jobs (not a transition). ``+ 0``: status and
-- consumer checked on the row, so only the primary key serves it.
UPDATE jobs_job SET
    deadline = GREATEST(deadline,
                        now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, incremental_timeout)) * interval '1 second'),
    incremental_timeout = COALESCE(%(inc)s::float8, incremental_timeout)
 WHERE id = ANY(%(ids)s::bigint[]) AND status + 0 = 1002 AND consumer_id + 0 = %(consumer)s::bigint
RETURNING id, deadline, retry_count;

-- claim_push --
-- index: job_push_fresh, job_push_retry
-- hot
-- Claim due QUEUED jobs across every push consumer within maxInFlight and the GCRA pacing of
-- maxDeliveriesPerSecond; partitioned jobs only of partitions %(worker)s holds a live lease on.
-- Run after push_claim_lock in the dispatcher's transaction. Statuses inlined (generic plans).
-- Circuit breaker (jobs.circuit; circuit states CLOSED 0, OPEN 1, HALF_OPEN 2; ``cb`` is the
-- consumer's consumers_circuit row, by its primary key consumer_id, NULL while it never failed):
-- OPEN or HALF_OPEN leaves room for one probe once next_probe_at has passed; after ``failures``
-- consecutive failures (below the threshold) at most threshold - failures requests are out at
-- once; NULL (no cap) when the breaker is off or never failed. The job claimed for an OPEN
-- circuit is its probe (CTE probe: HALF_OPEN until recorded). Returns m.type (filters) and
-- r.cb_dirty (the circuit was counting failures or open when claimed).
WITH k AS MATERIALIZED (
    SELECT c.id, c.updated_at,
           LEAST(c.max_in_flight, c.max_ack_pending, CASE WHEN c.circuit_breaker_failures > 0 THEN
                CASE WHEN cb.state IN (1, 2) THEN CASE WHEN cb.next_probe_at <= now() THEN 1 ELSE 0 END
                     WHEN cb.failures > 0 THEN GREATEST(c.circuit_breaker_failures - cb.failures, 1) END END)
             - (SELECT count(*) FROM jobs_job i
                 WHERE i.consumer_id = c.id AND i.status = 1002) AS room,
           c.max_deliveries_per_second AS rate, c.ordered,
           COALESCE(c.connection_timeout, %(conn_timeout)s::float8) + 0.25 + %(rational)s::float8 AS ttl,
           GREATEST(extract(epoch FROM p.tat - now()), 0) AS lag,
           c.circuit_breaker_failures > 0 AND cb.state IN (1, 2) AS probing,
           c.circuit_breaker_probe_seconds AS probe, COALESCE(cb.failures > 0 OR cb.state <> 0, false) AS cb_dirty
      FROM consumers_consumer c
      LEFT JOIN jobs_pushpace p ON p.consumer_id = c.id
      LEFT JOIN consumers_circuit cb ON cb.consumer_id = c.id  -- circuit breaker (jobs.circuit)
     WHERE c.type = 'push' AND NOT c.paused  -- flow control: a paused consumer gets nothing
), r AS MATERIALIZED (
    -- room: maxInFlight minus what is in flight now (any process), capped by the GCRA pacing
    -- of maxDeliveriesPerSecond (bursts of rate/20, at least 1)
    SELECT id, updated_at, rate, ttl, lag, ordered, probing, probe, cb_dirty,
           LEAST(room, %(limit)s::int,
                 CASE WHEN rate IS NULL OR rate <= 0 THEN %(limit)s::int
                      ELSE floor(GREATEST(1, ceil(rate / 20.0)) - COALESCE(lag, 0) * rate)::int END) AS room
      FROM k
), cand AS MATERIALIZED (
    SELECT x.id, x.priority
      FROM r CROSS JOIN LATERAL (
          SELECT y.id, y.priority FROM (
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count = 0
                  AND j.next_attempt_at <= now()
                  AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
                  AND (j.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
            AND pt.status = 1 AND pt.owner = %(worker)s::text AND pt.lease_until > now()) = j.gate
        AND NOT (r.ordered AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
               AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))
                ORDER BY j.priority DESC, j.id LIMIT r.room)
              UNION ALL
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count > 0
                  AND j.next_attempt_at <= now()
                  AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
                  AND (j.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
            AND pt.status = 1 AND pt.owner = %(worker)s::text AND pt.lease_until > now()) = j.gate
        AND NOT (r.ordered AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
               AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))
                ORDER BY j.next_attempt_at LIMIT r.room)
          ) y ORDER BY y.priority DESC, y.id LIMIT r.room
      ) x
     WHERE r.room > 0
     ORDER BY x.priority DESC, x.id
     LIMIT %(limit)s::int
), u AS (
    -- Lock and move by primary key (id = ANY(array)): the plan then never depends on the
    -- table's statistics (a cached generic plan built on a fresh table once scanned every
    -- queued job here).
    UPDATE jobs_job j SET status = 1002, status_changed_at = now(),
                          deadline = now() + r.ttl * interval '1 second', last_reason = %(reason)s::text
      FROM (SELECT p.id, p.consumer_id FROM jobs_job p
             WHERE p.id = ANY(ARRAY(SELECT id FROM cand)) AND p.status = 1001
               FOR UPDATE SKIP LOCKED) pick
      JOIN r ON r.id = pick.consumer_id
     WHERE j.id = pick.id
    RETURNING j.id, j.consumer_id, j.message_id, j.priority, j.retry_count, j.partition_id, j.gate, j.payload
), pace AS (
    INSERT INTO jobs_pushpace (consumer_id, tat)
    SELECT u.consumer_id, now() + (max(r.lag) + count(*) / max(r.rate)) * interval '1 second'
      FROM u JOIN r ON r.id = u.consumer_id
     WHERE r.rate > 0
     GROUP BY u.consumer_id
    ON CONFLICT (consumer_id) DO UPDATE SET tat = EXCLUDED.tat
), probe AS (
    -- circuit breaker: the job claimed for an OPEN circuit is its probe (HALF_OPEN until recorded)
    UPDATE consumers_circuit cb SET state = 2, next_probe_at = now() + r.probe * interval '1 second'
      FROM r WHERE cb.consumer_id = r.id AND r.probing AND r.id IN (SELECT consumer_id FROM u)
)
SELECT u.id, u.consumer_id, u.priority, u.retry_count, m.message_id, COALESCE(u.payload, m.payload),
       m.content_type, m.headers, r.updated_at,
       CASE WHEN u.partition_id IS NOT NULL
            THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type, r.cb_dirty
  FROM u JOIN broker_message m ON m.id = u.message_id JOIN r ON r.id = u.consumer_id
 ORDER BY u.priority DESC, u.id;

-- pull_move_auth --
-- index: pk
-- hot
-- The spec path's state change in one round trip: the auth row (channel, consumer, job) and the
-- job's move when the tokens match (md5 digests compared), the consumer is a pull consumer and the
-- job is in one of %(from_s)s; never to INFLIGHT on a consumer with a priority policy.
WITH a AS (
    SELECT ch.id AS ch_pk, ch.token AS ch_token, c.id AS c_pk, c.token AS c_token, c.type AS c_type,
           c.max_retry, j.id AS j_id, j.status AS j_status, j.retry_count, j.incremental_timeout,
           j.deadline < now() AS expired, c.priority_policy AS c_policy
      FROM broker_channel ch
      LEFT JOIN consumers_consumer c ON c.channel_id = ch.id AND c.consumer_id = %(consumer)s::text
      LEFT JOIN jobs_job j ON j.id = %(job)s::bigint AND j.consumer_id = c.id
     WHERE ch.channel_id = %(channel)s::text
), u AS (
    UPDATE jobs_job j SET
        status = %(to_s)s::smallint,
        retry_count = j.retry_count + CASE WHEN j.status = 1004 THEN 1 ELSE 0 END,
        status_changed_at = now(),
        deadline = CASE WHEN %(to_s)s::smallint = 1002
                        THEN now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, j.incremental_timeout)) * interval '1 second'
                   END,
        incremental_timeout = COALESCE(%(inc)s::float8, j.incremental_timeout),
        last_reason = %(reason)s::text
      FROM a
     WHERE j.id = a.j_id AND j.consumer_id = a.c_pk AND a.c_type = 'pull'
       AND j.status = a.j_status AND a.j_status = ANY(%(from_s)s::smallint[])
       AND (%(to_s)s::smallint <> 1002 OR j.expires_at IS NULL OR j.expires_at > now())  -- expiry
       AND (a.c_policy = 'none' OR %(to_s)s::smallint <> 1002)
       AND md5(a.ch_token) = md5(%(ch_token)s::text) AND md5(a.c_token) = md5(%(c_token)s::text)
    RETURNING j.id, j.status, j.retry_count, j.partition_id
)
SELECT a.*, (SELECT count(*) FROM u), (SELECT u.partition_id FROM u),
       -- %(async_commit)s: commit without waiting for the WAL flush (jobs.pull_moves): SET LOCAL for
       -- the statement's own transaction (autocommit), read when it commits
       CASE WHEN %(async_commit)s::bool THEN set_config('synchronous_commit', 'off', true) END FROM a;

-- ack --
-- index: pk
-- hot
-- A pull consumer's outcomes for many in-flight jobs (the batch ack): INFLIGHT -> DELIVERED /
-- DEAD / QUEUED (retry + 1, DEAD past max_retry); waiting pulls are notified of requeues.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(to_s)s::smallint[], %(delay)s::float8[]) AS v(id, to_s, delay)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = 1001 AND j.retry_count + 1 > %(max_retry)s::int THEN 1004 ELSE v.to_s END,
        retry_count = j.retry_count + CASE WHEN v.to_s = 1001 THEN 1 ELSE 0 END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.to_s = 1001 THEN now() + COALESCE(v.delay, 0) * interval '1 second'
                               ELSE j.next_attempt_at END,
        deadline = NULL,
        last_reason = %(reason)s::text
      FROM v
     WHERE j.id = v.id AND j.status + 0 = 1002 AND j.consumer_id + 0 = %(consumer)s::bigint  -- by primary key only
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), n AS (
    SELECT pg_notify('broker_jobs', %(consumer)s::text) FROM u WHERE status = 1001 LIMIT 1
)
SELECT v.id, u.status, u.retry_count, c.status, (SELECT count(*) FROM n), u.partition_id
  FROM v LEFT JOIN u ON u.id = v.id
         LEFT JOIN jobs_job c ON u.id IS NULL AND c.id = v.id AND c.consumer_id + 0 = %(consumer)s::bigint;

-- push_record --
-- index: pk
-- hot
-- Finished push attempts: each job still INFLIGHT moves (DELIVERED / QUEUED / DEAD), and every
-- attempt's row is written. Statuses inlined (generic plans).
-- Circuit breaker (jobs.circuit; circuit states CLOSED 0, OPEN 1, HALF_OPEN 2; consumers_circuit
-- read and written by primary key): a failed probe (its consumer's circuit is HALF_OPEN: the only
-- job in flight) goes back to QUEUED without spending a retry; each consumer's consecutive
-- failures add up (%(cb_ok)s: a success in the batch restarts the count) and reaching the threshold
-- opens the circuit. ``since`` moves only when the circuit opens or closes, so the rows returned as
-- changed are the advisories to raise. Returns (partition to settle, NULL, NULL) rows and
-- (NULL, consumer, new state) rows for circuits that changed.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(to_s)s::smallint[], %(delay)s::float8[], %(max_retry)s::int[])
           AS v(id, to_s, delay, max_retry)
), u AS (
    UPDATE jobs_job j SET
        status = CASE WHEN v.to_s = 1001 AND j.retry_count + 1 > v.max_retry AND NOT EXISTS (SELECT 1 FROM consumers_circuit pc WHERE pc.consumer_id = j.consumer_id
                                                     AND pc.state = 2) THEN 1004
                      ELSE v.to_s END,
        retry_count = CASE WHEN v.to_s = 1001 AND NOT EXISTS (SELECT 1 FROM consumers_circuit pc WHERE pc.consumer_id = j.consumer_id
                                                     AND pc.state = 2) THEN j.retry_count + 1 ELSE j.retry_count END,
        status_changed_at = now(),
        next_attempt_at = CASE WHEN v.to_s = 1001 THEN now() + v.delay * interval '1 second'
                               ELSE j.next_attempt_at END,
        deadline = NULL,
        last_reason = 'push'
      FROM v
     WHERE j.id = v.id AND j.id = ANY(%(ids)s::bigint[]) AND j.status + 0 = 1002  -- by primary key only
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), a AS (
INSERT INTO jobs_deliveryattempt (job_id, attempt, started_at, duration_ms, status_code, response_excerpt,
                                  error, request_id, outcome)
SELECT a.id, a.attempt, now() - a.age * interval '1 second', a.duration_ms, a.status_code, a.excerpt,
       a.error, a.request_id, a.outcome
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ages)s::float8[], %(durations)s::float8[],
              %(codes)s::int[], %(excerpts)s::text[], %(errors)s::text[], %(request_ids)s::text[],
              %(outcomes)s::text[])
       AS a(id, attempt, age, duration_ms, status_code, excerpt, error, request_id, outcome)
), cbx AS (
    -- circuit breaker: per consumer of the batch, whether an attempt succeeded and how many failed
    -- after the last success
    SELECT * FROM unnest(%(cb_consumers)s::bigint[], %(cb_ok)s::bool[], %(cb_fails)s::int[]) AS x(consumer_id, ok, fails)
), cbu AS (
    UPDATE consumers_circuit cb SET
        failures = CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END, state = CASE WHEN k.circuit_breaker_failures > 0 AND CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END >= k.circuit_breaker_failures THEN 1 ELSE 0 END,
        since = CASE WHEN (CASE WHEN k.circuit_breaker_failures > 0 AND CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END >= k.circuit_breaker_failures THEN 1 ELSE 0 END = 0) <> (cb.state = 0) THEN now() ELSE cb.since END,
        next_probe_at = CASE WHEN CASE WHEN k.circuit_breaker_failures > 0 AND CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END >= k.circuit_breaker_failures THEN 1 ELSE 0 END = 1 AND cb.state <> 1
                             THEN now() + k.circuit_breaker_probe_seconds * interval '1 second' ELSE cb.next_probe_at END
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE cb.consumer_id = x.consumer_id AND (x.fails > 0 OR cb.failures > 0 OR cb.state <> 0)
    RETURNING cb.consumer_id, cb.state, cb.since = now() AS changed
), cbi AS (
    INSERT INTO consumers_circuit (consumer_id, state, since, failures, next_probe_at)
    SELECT x.consumer_id, CASE WHEN x.fails >= k.circuit_breaker_failures THEN 1 ELSE 0 END, now(),
           x.fails, now() + k.circuit_breaker_probe_seconds * interval '1 second'
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE x.fails > 0 AND k.circuit_breaker_failures > 0
       AND NOT EXISTS (SELECT 1 FROM consumers_circuit e WHERE e.consumer_id = x.consumer_id)
    ON CONFLICT (consumer_id) DO UPDATE SET failures = consumers_circuit.failures + EXCLUDED.failures
    RETURNING consumer_id, state
)
-- partitions to settle (jobs.partitions): nothing to return for non-partitioned jobs; circuits
-- that changed state (advisories)
SELECT DISTINCT partition_id, NULL::bigint, NULL::smallint FROM u WHERE partition_id IS NOT NULL AND status <> 1001
UNION ALL SELECT NULL, consumer_id, state FROM cbu WHERE changed
UNION ALL SELECT NULL, consumer_id, state FROM cbi WHERE state = 1;

-- gate_move --
-- index: pk
-- hot
-- A partitioned job's handler said "continue at gate n": INFLIGHT -> QUEUED at the higher gate
-- (retry reset, optional new payload), by primary key only.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(gates)s::int[], %(payloads)s::bytea[], %(keep)s::bool[])
           AS v(id, gate, payload, keep)
), u AS (
    UPDATE jobs_job j SET
        status = 1001, gate = v.gate, retry_count = 0,
        payload = CASE WHEN v.keep THEN j.payload ELSE v.payload END,
        status_changed_at = now(), next_attempt_at = now(), deadline = NULL, last_reason = 'gate'
      FROM v
     WHERE j.id = v.id AND j.status + 0 = 1002 AND j.partition_id + 0 IS NOT NULL AND v.gate > j.gate
       AND (%(consumer)s::bigint IS NULL OR j.consumer_id + 0 = %(consumer)s::bigint)  -- by primary key only
    RETURNING j.id, j.retry_count, j.partition_id, j.consumer_id
), n AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ','))
      FROM u HAVING count(*) > 0
)
SELECT id, partition_id, (SELECT count(*) FROM n) FROM u;
-- push_claim_lock --
-- index: none (an advisory lock)
-- Serializes push claims database-wide for the rest of the transaction (key PUSH_CLAIM_LOCK):
-- each claim's fresh snapshot then sees every earlier one, so two dispatchers never fill one slot.
SELECT pg_advisory_xact_lock(%s);

-- push_transaction_setup --
-- index: none (settings only)
-- First in a push dispatcher's transaction: reuse the prepared generic plans, and no WAL flush
-- before going on (a crash may lose the last milliseconds of claims: at-least-once still holds).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('synchronous_commit', 'off', true);

-- publish_auth --
-- index: counter_key
-- hot
-- A publish's auth row: channel, producer, their tokens and rate limit, and flow control's backlog
-- cap (the first consumer of the channel whose QUEUED count, from the maintained counters, has
-- reached its maxQueued; channels without caps pay one probe of the consumer index by channel).
SELECT c.id, c.token, p.id, p.token,
       (SELECT k.consumer_id FROM consumers_consumer k
         WHERE k.channel_id = c.id AND k.max_queued IS NOT NULL
           AND k.max_queued <= COALESCE((SELECT sum(x.n) FROM (
                   SELECT count AS n FROM broker_counter
                    WHERE scope = 1 AND owner_id = k.id AND status = 1001
                   UNION ALL
                   SELECT delta FROM broker_counterdelta
                    WHERE scope = 1 AND owner_id = k.id AND status = 1001) x), 0)
         ORDER BY k.consumer_id LIMIT 1),
       p.rate_limit_per_second, p.burst
  FROM broker_channel c LEFT JOIN broker_producer p ON p.producer_id = %(producer)s::text
 WHERE c.channel_id = %(channel)s::text;

-- producer_rate_take --
-- index: pk
-- Spend %(n)s tokens of the producer's bucket in one conditional UPDATE (the row lock serializes
-- concurrent publishes across processes; database time). No row: not enough tokens.
UPDATE broker_producer SET
    rate_tokens = LEAST(%(burst)s::float8,
                        COALESCE(rate_tokens + extract(epoch FROM now() - rate_at) * %(rate)s::float8,
                                 %(burst)s::float8)) - %(n)s::float8,
    rate_at = now()
 WHERE id = %(producer)s::bigint
   AND LEAST(%(burst)s::float8,
             COALESCE(rate_tokens + extract(epoch FROM now() - rate_at) * %(rate)s::float8,
                      %(burst)s::float8)) >= %(n)s::float8
RETURNING rate_tokens;

-- insert_one --
-- index: message_unique_per_channel
-- hot
-- One message and its fan-out in one statement: the message (a duplicate id inserts nothing), one
-- QUEUED job per consumer of its channel (jobs_created), and a NOTIFY of their waiters on commit.
WITH m AS (
    INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                headers, status, received_at, dispatched_at, type, expires_at)
    VALUES (%(channel)s::bigint, %(mid)s::text, %(producer)s::bigint, %(payload)s::bytea, %(ctype)s::text,
            %(prio)s::int, %(headers)s::jsonb, 102, now(), now(),
            %(type)s::text, now() + COALESCE(%(ttl)s::int, (SELECT message_ttl FROM broker_channel WHERE id = %(channel)s::bigint)) * interval '1 second')
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id, message_id, priority, channel_id, type, expires_at
), jobs_created AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                          next_attempt_at, incremental_timeout, status_changed_at, created_at, expires_at)
    SELECT src.id, c.id, c.channel_id, 1001, src.priority, 0, now(), 0, now(), now(), src.expires_at
      FROM m src JOIN consumers_consumer c ON c.channel_id = src.channel_id
     WHERE (c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes
     ORDER BY src.id, c.id  -- job ids follow message order: pulls are "oldest first" by job id
    RETURNING consumer_id
), jobs_notified AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ',')) AS n
      FROM jobs_created HAVING count(*) > 0
)
SELECT m.message_id, (SELECT count(*) FROM jobs_notified) FROM m;

-- insert_many --
-- index: message_unique_per_channel
-- hot
-- insert_one for a batch of messages (input order kept: job ids follow message order).
WITH m AS (
    INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                headers, status, received_at, dispatched_at, type, expires_at)
    SELECT %(channel)s::bigint, t.mid, %(producer)s::bigint, t.payload, t.ctype, t.prio, t.headers, 102, now(), now(),
           t.type, now() + COALESCE(t.ttl, (SELECT message_ttl FROM broker_channel WHERE id = %(channel)s::bigint)) * interval '1 second'
      FROM unnest(%(mids)s::text[], %(payloads)s::bytea[], %(ctypes)s::text[], %(prios)s::int[],
                  %(headers)s::jsonb[], %(types)s::text[], %(ttls)s::int[])
           WITH ORDINALITY AS t(mid, payload, ctype, prio, headers, type, ttl, ord)
     ORDER BY t.ord
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id, message_id, priority, channel_id, type, expires_at
), jobs_created AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                          next_attempt_at, incremental_timeout, status_changed_at, created_at, expires_at)
    SELECT src.id, c.id, c.channel_id, 1001, src.priority, 0, now(), 0, now(), now(), src.expires_at
      FROM m src JOIN consumers_consumer c ON c.channel_id = src.channel_id
     WHERE (c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes
     ORDER BY src.id, c.id  -- job ids follow message order: pulls are "oldest first" by job id
    RETURNING consumer_id
), jobs_notified AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ',')) AS n
      FROM jobs_created HAVING count(*) > 0
)
SELECT m.message_id, (SELECT count(*) FROM jobs_notified) FROM m;

-- insert_partitioned --
-- index: message_unique_per_channel
-- hot
-- insert_many for messages with partition keys: each job joins its consumer's partition of the key
-- (upserted before, in the same transaction) at the message's gate.
WITH m AS (
    INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                headers, status, received_at, dispatched_at, type, expires_at)
    SELECT %(channel)s::bigint, t.mid, %(producer)s::bigint, t.payload, t.ctype, t.prio, t.headers, 102, now(), now(),
           t.type, now() + COALESCE(t.ttl, (SELECT message_ttl FROM broker_channel WHERE id = %(channel)s::bigint)) * interval '1 second'
      FROM unnest(%(mids)s::text[], %(payloads)s::bytea[], %(ctypes)s::text[], %(prios)s::int[],
                  %(headers)s::jsonb[], %(types)s::text[], %(ttls)s::int[])
           WITH ORDINALITY AS t(mid, payload, ctype, prio, headers, type, ttl, ord)
     ORDER BY t.ord
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id, message_id, priority, channel_id, type, expires_at
), src AS (
    SELECT DISTINCT ON (m.id) m.id, m.priority, m.channel_id, m.type, m.expires_at, k.pkey, k.gate
      FROM m JOIN unnest(%(mids)s::text[], %(pkeys)s::text[], %(gates)s::int[]) WITH ORDINALITY
                  AS k(mid, pkey, gate, ord) ON k.mid = m.message_id
     ORDER BY m.id, k.ord
), jobs_created AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                          next_attempt_at, incremental_timeout, status_changed_at, created_at,
                          expires_at, partition_id, gate)
    SELECT src.id, c.id, c.channel_id, 1001, src.priority, 0, now(), 0, now(), now(),
           src.expires_at, pt.id, CASE WHEN pt.id IS NULL THEN 0 ELSE src.gate END
      FROM src JOIN consumers_consumer c ON c.channel_id = src.channel_id
      LEFT JOIN jobs_partition pt ON pt.consumer_id = c.id AND pt.key = src.pkey
     WHERE (c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes
     ORDER BY src.id, c.id  -- job ids follow message order: pulls are "oldest first" by job id
    RETURNING consumer_id
), jobs_notified AS (
    SELECT pg_notify('broker_jobs', string_agg(DISTINCT consumer_id::text, ',')) AS n
      FROM jobs_created HAVING count(*) > 0
)
SELECT m.message_id, (SELECT count(*) FROM jobs_notified) FROM m;

-- pull_auth --
-- index: pk
-- hot
-- A pull request's auth row: channel, consumer (with its priority-group config) and job, by key.
SELECT ch.id, ch.token, c.id, c.token, c.type, c.max_retry,
       j.id, j.status, j.retry_count, j.incremental_timeout, j.deadline < now(),
       c.priority_policy, c.priority_groups, c.priority_timeout
  FROM broker_channel ch
  LEFT JOIN consumers_consumer c ON c.channel_id = ch.id AND c.consumer_id = %(consumer)s::text
  LEFT JOIN jobs_job j ON j.id = %(job)s::bigint AND j.consumer_id = c.id
 WHERE ch.channel_id = %(channel)s::text;

-- queued_jobs --
-- index: job_claim
-- hot
-- Due QUEUED jobs of a consumer in claim order, each message by primary key (LATERAL ... LIMIT 1 is
-- never turned into a join: a generic plan hash-joined the whole message table, 600 ms at 1M).
-- A literal bound inside (100 = the largest limit), the caller's limit outside: a generic plan
-- estimates "LIMIT $n" at 10 % of the rows, and with one consumer owning a 1M backlog it chose a
-- parallel sequential scan and a sort (204 ms against 0.16 ms, issue 21).
SELECT j.id, j.priority, j.incremental_timeout, m.message_id, m.payload, m.content_type, m.headers, m.type
  FROM (SELECT b.id, b.priority, b.incremental_timeout, b.message_id FROM (
        SELECT id, priority, incremental_timeout, message_id FROM jobs_job
         WHERE consumer_id = %(consumer)s::bigint AND status = 1001 AND next_attempt_at <= now()
           AND (expires_at IS NULL OR expires_at > now())  -- expiry: never listed once expired
         ORDER BY priority DESC, id LIMIT 100  -- bound: jobs.pull.QUEUED_JOBS_MAX
        ) b LIMIT %(limit)s::int) j
  CROSS JOIN LATERAL (SELECT message_id, payload, content_type, headers, type FROM broker_message
                       WHERE id = j.message_id LIMIT 1) m
 ORDER BY j.priority DESC, j.id;

-- pull_job --
-- index: pk
-- hot
-- One job of a consumer with its message, producer and consumer (webhook-broker's job shape).
SELECT j.id, j.status, j.retry_count, j.priority, j.incremental_timeout, j.deadline, j.status_changed_at,
       j.next_attempt_at, m.message_id, p.producer_id, c.callback_url, c.name
  FROM jobs_job j
  JOIN broker_message m ON m.id = j.message_id
  JOIN broker_producer p ON p.id = m.producer_id
  JOIN consumers_consumer c ON c.id = j.consumer_id
 WHERE j.id = %s AND j.consumer_id + 0 = %s;  -- by primary key only

-- pull_waiter --
-- index: job_push_fresh, job_push_retry, job_inflight_consumer
-- hot
-- A waiting pull registers (expired waiters of the consumer removed) and reads when to look again:
-- seconds until the earliest delayed job is due and until the earliest in-flight deadline.
-- Partitioned jobs count as due only while delayed (a gate advance NOTIFYs instead).
WITH gc AS (
    DELETE FROM consumers_pullwaiter WHERE consumer_id = %(consumer)s AND expires_at < now() - interval '5 seconds'
), w AS (
    INSERT INTO consumers_pullwaiter ("group", priority, pin_id, min_pending, min_ack_pending, batch, max_bytes,
                                      arrived_at, expires_at, consumer_id)
    VALUES (%(group)s, %(priority)s, %(pin)s, NULL, NULL, %(batch)s, %(max_bytes)s,
            now(), now() + %(expires)s * interval '1 second', %(consumer)s)
    RETURNING id
)
SELECT (SELECT id FROM w),
       EXTRACT(EPOCH FROM LEAST(
           (SELECT f.next_attempt_at FROM jobs_job f
             WHERE f.consumer_id = %(consumer)s AND f.status = 1001 AND f.retry_count = 0
               AND f.partition_id IS NULL AND (f.expires_at IS NULL OR f.expires_at > now())
             ORDER BY f.priority DESC, f.id LIMIT 1),
           (SELECT min(r.next_attempt_at) FROM jobs_job r
             WHERE r.consumer_id = %(consumer)s AND r.status = 1001 AND r.retry_count > 0
               AND (r.partition_id IS NULL OR r.next_attempt_at > now())
               AND (r.expires_at IS NULL OR r.expires_at > now()))) - now()),
       EXTRACT(EPOCH FROM (SELECT min(i.deadline) FROM jobs_job i
                            WHERE i.consumer_id = %(consumer)s AND i.status = 1002) - now());

-- pull_next --
-- index: job_push_fresh, job_push_retry, job_inflight_consumer
-- hot
-- pull_waiter's probes alone (a waiter woken without a job, and the priority groups).
SELECT
       EXTRACT(EPOCH FROM LEAST(
           (SELECT f.next_attempt_at FROM jobs_job f
             WHERE f.consumer_id = %(consumer)s AND f.status = 1001 AND f.retry_count = 0
               AND f.partition_id IS NULL AND (f.expires_at IS NULL OR f.expires_at > now())
             ORDER BY f.priority DESC, f.id LIMIT 1),
           (SELECT min(r.next_attempt_at) FROM jobs_job r
             WHERE r.consumer_id = %(consumer)s AND r.status = 1001 AND r.retry_count > 0
               AND (r.partition_id IS NULL OR r.next_attempt_at > now())
               AND (r.expires_at IS NULL OR r.expires_at > now()))) - now()),
       EXTRACT(EPOCH FROM (SELECT min(i.deadline) FROM jobs_job i
                            WHERE i.consumer_id = %(consumer)s AND i.status = 1002) - now());

-- pull_waiting --
-- index: pullwaiter_live
-- hot
-- How many pulls of the consumer are waiting now.
SELECT count(*) FROM consumers_pullwaiter WHERE consumer_id = %s AND expires_at > now();

-- group_waiters --
-- index: pullwaiter_live
-- hot
-- The live waiters of a consumer with a priority policy (arrival order sorted in Python: an ORDER BY
-- id let fresh statistics pick the pkey).
SELECT id, pin_id, priority, min_pending, min_ack_pending, batch, max_bytes, incremental_timeout,
       cardinality(job_ids), turn
  FROM consumers_pullwaiter
 WHERE consumer_id = %s AND state = 0 AND expires_at > now();

-- group_due --
-- index: job_claim
-- hot
-- Is a job due? The claim's own first step (an EXISTS was planned as a scan of the whole table with
-- the statistics of a smaller one).
SELECT (SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1001 AND next_attempt_at <= now()
                                  AND (expires_at IS NULL OR expires_at > now())  -- expiry
         ORDER BY priority DESC, id LIMIT 1) IS NOT NULL;

-- group_waiter_insert --
-- index: pullwaiter_live
-- A grouped pull's waiter (expired waiters of the consumer removed first).
WITH gc AS (
    DELETE FROM consumers_pullwaiter WHERE consumer_id = %(consumer)s AND expires_at < now() - interval '5 seconds'
)
INSERT INTO consumers_pullwaiter ("group", priority, pin_id, min_pending, min_ack_pending, batch, max_bytes,
                                  job_ids, state, turn, incremental_timeout, arrived_at, expires_at, consumer_id)
VALUES (%(group)s, %(priority)s, %(pin)s, %(min_pending)s, %(min_ack_pending)s, %(batch)s, %(max_bytes)s,
        '{}', 0, 0, %(inc)s, now(), now() + %(expires)s * interval '1 second', %(consumer)s)
RETURNING id;

-- group_jobs --
-- index: pk
-- hot
-- The jobs a group dispatch handed a waiter, still INFLIGHT, with their messages.
SELECT j.id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
       m.message_id, COALESCE(j.payload, m.payload), m.content_type, m.headers,
       (SELECT pt.key FROM jobs_partition pt WHERE pt.id = j.partition_id), j.gate, m.type  -- partitions, type
  FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
 WHERE j.id = ANY(%s::bigint[]) AND j.status + 0 = %s  -- by primary key only
 ORDER BY j.priority DESC, j.id;

-- pull_waiter_delete --
-- index: pk
-- A waiting pull is over (answered, timed out or failed).
DELETE FROM consumers_pullwaiter WHERE id = %s;

-- ack_current --
-- index: pk
-- The current status of the consumer's jobs a gate move in an ack did not move (the answer's detail).
SELECT id, status FROM jobs_job WHERE id = ANY(%s) AND consumer_id = %s;

-- partition_row --
-- index: pk
-- One partition with its consumer and channel ids, by primary key (partition AVAILABLE 1, FAILED 2,
-- COMPLETE 3).
SELECT p.id, p.consumer_id, p.key, p.gate, p.status, p.version, p.closed, p.auto_close,
       p.manual_checkpoint, p.owner, p.lease_until, p.created_at, p.updated_at,
       c.consumer_id, ch.channel_id, p.lease_until > now(), p.completed_at
  FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
  JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE p.id = %s;

-- partition_row_by_key --
-- index: partition_unique_key
-- partition_row by (consumer, key).
SELECT p.id, p.consumer_id, p.key, p.gate, p.status, p.version, p.closed, p.auto_close,
       p.manual_checkpoint, p.owner, p.lease_until, p.created_at, p.updated_at,
       c.consumer_id, ch.channel_id, p.lease_until > now(), p.completed_at
  FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
  JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE p.consumer_id = %s AND p.key = %s;

-- partition_counts --
-- index: job_partition_gate
-- hot
-- {(gate, status): n} of one partition's jobs at a gate or above: a bounded scan of one partition.
SELECT gate, status, count(*) FROM jobs_job WHERE partition_id = %s AND gate >= %s GROUP BY gate, status;

-- partition_gate_busy --
-- index: job_partition_gate
-- hot
-- Is the current gate's work under way (a job there QUEUED or INFLIGHT) and none DEAD? Then a settle
-- changes nothing for an AVAILABLE partition: two probes instead of counting every job of it.
SELECT EXISTS (SELECT 1 FROM jobs_job WHERE partition_id = %s AND gate = %s AND status = 1004),
       EXISTS (SELECT 1 FROM jobs_job WHERE partition_id = %s AND gate = %s AND status IN (1001, 1002));

-- partition_settle_write --
-- index: pk
-- A settle's result, written only if the row is still at the version read (optimistic concurrency).
UPDATE jobs_partition SET gate = %s, status = %s, version = version + 1, updated_at = now(),
       owner = CASE WHEN %s = 3 THEN '' ELSE owner END,
       lease_until = CASE WHEN %s = 3 THEN NULL ELSE lease_until END,
       completed_at = CASE WHEN %s = 3 THEN now() END
 WHERE id = %s AND version = %s
RETURNING version;

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

-- jobs_notify --
-- index: none (no table)
-- Wake a consumer's waiting pulls and push dispatchers (delivered on commit).
SELECT pg_notify('broker_jobs', %s);

-- partitions_stale --
-- index: job_partition_gate
-- hot
-- Partitions a settle would change (nothing claimable at the current gate yet: a DEAD job there,
-- later gates waiting, a FAILED one whose dead jobs are gone, or all done and closing). Each test
-- is a probe of one partition ("(SELECT 1 ... LIMIT 1)", which the planner cannot turn into a
-- join: as NOT EXISTS it merge-joined every partitioned job of the table).
SELECT p.id FROM jobs_partition p
 WHERE p.status IN (1, 2) AND p.updated_at < now() - interval '2 seconds'
   AND NOT (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                AND j.status IN (1001, 1002) LIMIT 1) IS NOT NULL
   AND CASE WHEN p.status = 2
            THEN NOT (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                         AND j.status = 1004 LIMIT 1) IS NOT NULL
            ELSE (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                     AND j.status = 1004 LIMIT 1) IS NOT NULL
                 OR (NOT p.manual_checkpoint AND (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id
                                                     AND j.gate > p.gate AND j.status <> 1003 LIMIT 1) IS NOT NULL)
                 OR ((p.closed OR p.auto_close) AND NOT (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id
                                                           AND j.gate >= p.gate AND j.status <> 1003 LIMIT 1) IS NOT NULL)
       END
 ORDER BY p.updated_at LIMIT %s;

-- partition_dead_jobs --
-- index: job_partition_gate
-- The DEAD jobs of a partition (partition retry).
SELECT id FROM jobs_job WHERE partition_id = %s AND status = 1004;

-- partition_gate_dead_jobs --
-- index: job_partition_gate
-- The DEAD jobs at a partition's gate (partition skip).
SELECT id FROM jobs_job WHERE partition_id = %s AND gate = %s AND status = 1004;

-- partitions_upsert --
-- index: partition_unique_key
-- Create or touch each consumer's partition of every key in a publish (a touch is a versioned write:
-- a settle that counted before this publish loses its race); a COMPLETE partition that was not
-- closed reopens. One lock order for every publisher: no deadlocks between them.
INSERT INTO jobs_partition (consumer_id, key, gate, status, owner, version, closed, auto_close,
                            manual_checkpoint, created_at, updated_at)
SELECT c.id, k.key, k.gate, 1, '', 0, false, false, false, now(), now()
  FROM consumers_consumer c CROSS JOIN unnest(%(keys)s::text[], %(gates)s::int[]) AS k(key, gate)
 WHERE c.channel_id = %(channel)s
 ORDER BY c.id, k.key  -- one lock order for every publisher: no deadlocks between them
ON CONFLICT (consumer_id, key) DO UPDATE SET
    version = jobs_partition.version + 1, updated_at = now(),
    status = CASE WHEN jobs_partition.status = 3 AND NOT jobs_partition.closed
                  THEN 1 ELSE jobs_partition.status END,
    completed_at = CASE WHEN jobs_partition.status = 3 AND NOT jobs_partition.closed
                        THEN NULL ELSE jobs_partition.completed_at END
RETURNING id, consumer_id, key, gate, status, closed;

-- leases_renew --
-- index: partition_owner
-- Renew a push worker's leases that run out soon (version-checked).
UPDATE jobs_partition p SET lease_until = now() + %(lease)s * interval '1 second', version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition
         WHERE owner = %(worker)s AND lease_until > now() AND status = 1
           AND lease_until < now() + %(renew_before)s * interval '1 second' ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s  -- version-checked
RETURNING p.id, p.version;

-- leases_release_idle --
-- index: partition_owner
-- Give back own leases with nothing to do (no QUEUED/INFLIGHT job at the current gate, or no longer
-- AVAILABLE), so fair shares count only partitions with work.
UPDATE jobs_partition p SET owner = '', lease_until = NULL, version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition q
         WHERE q.owner = %(worker)s
           AND (q.status <> 1 OR q.lease_until <= now() OR NOT EXISTS (
                SELECT 1 FROM jobs_job j WHERE j.partition_id = q.id AND j.gate = q.gate
                   AND j.status IN (1001, 1002))) ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s
RETURNING p.id, p.version;

-- leases_release_all --
-- index: partition_owner
-- A stopping worker gives back every lease.
UPDATE jobs_partition p SET owner = '', lease_until = NULL, version = p.version + 1
  FROM (SELECT id, version FROM jobs_partition WHERE owner = %(worker)s ORDER BY id) m
 WHERE p.id = m.id AND p.version = m.version AND p.owner = %(worker)s
RETURNING p.id, p.version;

-- leases_owners --
-- index: partition_owner
-- Live leases per worker (fair shares).
SELECT owner, count(*) FROM jobs_partition
 WHERE owner <> '' AND lease_until > now() GROUP BY owner;

-- partitions_free --
-- index: job_partition_gate
-- hot
-- Free or expired AVAILABLE partitions of push consumers with a QUEUED job at the current gate and
-- none in flight (a job still in flight belongs to the worker that claimed it).
SELECT p.id, p.version FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
 WHERE c.type = 'push' AND NOT c.paused AND p.status = 1
   AND (p.owner = '' OR p.lease_until <= now())
   -- probes per partition (LIMIT 1 subqueries are never turned into joins: as NOT EXISTS a generic
   -- plan hashed every in-flight partitioned job first)
   AND (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate AND j.status = 1001
         LIMIT 1) IS NOT NULL
   AND (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate AND j.status = 1002
         LIMIT 1) IS NULL
 LIMIT %(limit)s;

-- leases_take --
-- index: pk
-- Take leases of partitions still at the version read.
UPDATE jobs_partition p SET owner = %(worker)s, lease_until = now() + %(lease)s * interval '1 second',
       version = p.version + 1
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS v(id, version)
 WHERE p.id = v.id AND p.version = v.version AND p.status = 1
RETURNING p.id, p.version;

-- lease_steal_candidate --
-- index: partition_owner
-- One partition of an over-share worker with nothing in flight, to take over.
SELECT p.id, p.version FROM jobs_partition p
 WHERE p.owner = %(victim)s AND p.lease_until > now() AND p.status = 1
   AND NOT EXISTS (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate
                      AND j.status = 1002)
 ORDER BY random() LIMIT 1;

-- push_targets --
-- index: pk
-- Push consumers by pk, as the callbacks need them (with their channel id).
SELECT c.id, c.consumer_id, ch.channel_id, c.callback_url, c.token, c.signing_secret,
       c.previous_signing_secret, c.previous_secret_expires_at, c.connection_timeout, c.max_retry,
       c.retry_backoff, c.max_deliveries_per_second, c.updated_at
  FROM consumers_consumer c JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE c.id = ANY(%s);

-- pull_consumer_ids --
-- index: none (a small table, read whole)
-- The pull consumers' ids: a NOTIFY naming only these calls for no push claim.
SELECT id FROM consumers_consumer WHERE type = 'pull';

-- scheduled_create --
-- index: scheduled_unique_per_channel
-- Store a message to publish later when it is far enough ahead (database clock) and its id is not
-- used in the channel by a message (message_unique_per_channel) or another scheduled one.
WITH chk AS (
    SELECT %(at)s >= now() + %(min_delay)s * interval '1 second' AS in_time,
           EXISTS (SELECT 1 FROM broker_message WHERE channel_id = %(channel)s AND message_id = %(mid)s) AS taken
), ins AS (
    INSERT INTO broker_scheduledmessage (channel_id, message_id, producer_id, payload, content_type, priority,
                                         headers, status, dispatch_at, created_at, error, type, ttl)
    SELECT %(channel)s, %(mid)s, %(producer)s, %(payload)s, %(ctype)s, %(prio)s, %(headers)s, %(scheduled)s,
           %(at)s, now(), '', %(type)s, %(ttl)s
      FROM chk WHERE in_time AND NOT taken
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id
)
SELECT in_time, taken, (SELECT count(*) FROM ins) FROM chk;

-- scheduled_due --
-- index: scheduled_due
-- Due scheduled messages, oldest due first, locked SKIP LOCKED (several workers dispatch at once).
SELECT s.id, s.channel_id, ch.channel_id, s.producer_id, p.producer_id, s.message_id, s.payload,
       s.content_type, s.priority, s.headers, s.type, s.ttl
  FROM broker_scheduledmessage s
  JOIN broker_channel ch ON ch.id = s.channel_id
  JOIN broker_producer p ON p.id = s.producer_id
 WHERE s.status = %(scheduled)s AND s.dispatch_at <= now()
 ORDER BY s.dispatch_at
 LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED;

-- scheduled_mark --
-- index: pk
-- The outcome of each dispatched scheduled message (still SCHEDULED: a cancel may have won).
UPDATE broker_scheduledmessage s SET status = v.status, dispatched_at = now(), error = v.error
  FROM unnest(%(ids)s::bigint[], %(statuses)s::smallint[], %(errors)s::text[]) AS v(id, status, error)
 WHERE s.id = v.id AND s.status = %(scheduled)s;

-- scheduled_cancel --
-- index: scheduled_unique_per_channel
-- Delete a scheduled message not dispatched yet (a dispatch in progress holds the row lock).
DELETE FROM broker_scheduledmessage WHERE channel_id = %s AND message_id = %s AND status = %s
RETURNING id;

-- scheduled_status --
-- index: scheduled_unique_per_channel
-- A scheduled message's status (why a cancel found nothing to delete).
SELECT status FROM broker_scheduledmessage WHERE channel_id = %s AND message_id = %s;

-- scheduled_next --
-- index: scheduled_next_by_channel
-- Due time of the channel's next pending scheduled message.
SELECT min(dispatch_at) FROM broker_scheduledmessage WHERE channel_id = %s AND status = %s;

-- advisory_producer_create --
-- index: broker_producer_producer_id_key
-- The advisories' own producer, created on first use (concurrent first uses: one insert wins).
INSERT INTO broker_producer (producer_id, name, token, created_at, updated_at)
VALUES (%s, %s, %s, now(), now()) ON CONFLICT (producer_id) DO NOTHING;

-- advisory_insert --
-- index: none (an insert)
-- Record an advisory.
INSERT INTO consumers_advisory (type, channel_id, consumer_id, consumer_pk, "group", data, created_at)
VALUES (%s, %s, %s, %s, %s, %s::jsonb, now()) RETURNING id, created_at;

-- group_lock --
-- index: none (an advisory lock)
-- Serialize every decision about one consumer's waiters and pins, across all processes, for the
-- rest of the transaction (key: "pr" + consumer pk).
SELECT pg_advisory_xact_lock(%s::bigint);

-- group_state_ensure --
-- index: group_state_unique
-- A priority group's state row, created on first use.
INSERT INTO consumers_prioritygroupstate (consumer_id, "group", pinned_client_id) VALUES (%s, %s, '')
ON CONFLICT (consumer_id, "group") DO NOTHING;

-- group_state_read --
-- index: group_state_unique
-- A group's pin and the seconds until its timer (the first parameter, in seconds) runs out.
SELECT pinned_client_id, pinned_ts, EXTRACT(EPOCH FROM renewed_at + %s * interval '1 second' - now())
  FROM consumers_prioritygroupstate WHERE consumer_id = %s AND "group" = %s;

-- group_unpin --
-- index: group_state_unique
-- Release a group's pin.
UPDATE consumers_prioritygroupstate SET pinned_client_id = '', pinned_ts = NULL, renewed_at = NULL
 WHERE consumer_id = %s AND "group" = %s;

-- group_pin --
-- index: group_state_unique
-- Pin a group to a client (its timer starts now).
UPDATE consumers_prioritygroupstate SET pinned_client_id = %s, pinned_ts = now(), renewed_at = now()
 WHERE consumer_id = %s AND "group" = %s RETURNING pinned_ts;

-- group_pin_renew --
-- index: group_state_unique
-- The pinned client pulled: its pin timer starts again.
UPDATE consumers_prioritygroupstate SET renewed_at = now() WHERE consumer_id = %s AND "group" = %s;

-- group_waiter_serve --
-- index: pk
-- Hand jobs to a waiting grouped pull (served when its batch is full).
UPDATE consumers_pullwaiter SET job_ids = job_ids || %s::bigint[], state = %s, pin_id = %s, turn = %s
 WHERE id = %s;

-- group_waiter_wrong_pin --
-- index: pk
-- A waiting grouped pull holds a pin that is not the group's: it is answered 423.
UPDATE consumers_pullwaiter SET state = %s WHERE id = %s;

-- group_waiter_state --
-- index: pk
-- A grouped waiter's state (still WAITING?).
SELECT state FROM consumers_pullwaiter WHERE id = %s;

-- group_waiter_finish --
-- index: pk
-- Remove a grouped waiter, returning what it was handed (under the group lock).
DELETE FROM consumers_pullwaiter WHERE id = %s RETURNING job_ids, state, pin_id;

-- doorbell_ring --
-- index: job_claim, job_consumer_status
-- hot
-- Decide and record in one statement which pull consumers with a callback URL ring now (all, or
-- %(ids)s): ready (a due QUEUED job, job_claim) and not paused, and armed, or the job marked at the
-- last ring is gone; throttled by notify_interval. The mark and the oldest queued job are probes of
-- job_consumer_status with ranges, not equalities: with plain equalities the ORDER BY collapses to
-- "id" and, in a correlated subquery, the planner may walk the primary key filtering every other
-- consumer's rows (measured: 16 ms per 100k rows).
WITH c AS MATERIALIZED (
    SELECT c.id, c.paused, c.notify_interval, d.consumer_id IS NULL AS fresh, d.armed, d.mark, d.next_ring_at,
           (SELECT j.id FROM jobs_job j WHERE j.consumer_id = c.id AND j.status = 1001
                AND j.next_attempt_at <= now() AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
              ORDER BY j.priority DESC, j.id LIMIT 1) IS NOT NULL AS ready
      FROM consumers_consumer c LEFT JOIN consumers_doorbellstate d ON d.consumer_id = c.id
     WHERE c.type = 'pull' AND c.callback_url <> ''
       AND (%(ids)s::bigint[] IS NULL OR c.id = ANY(%(ids)s::bigint[]))
), decided AS (
    SELECT c.*, CASE
        WHEN NOT c.ready THEN CASE WHEN c.fresh OR NOT c.armed THEN 'arm' END
        WHEN c.paused THEN NULL
        WHEN c.fresh OR c.armed OR c.mark IS NULL
             OR NOT EXISTS (SELECT 1 FROM jobs_job m WHERE m.id = c.mark AND m.status = 1001)
        THEN CASE WHEN c.next_ring_at IS NULL OR c.next_ring_at <= now() THEN 'ring' ELSE 'wait' END
    END AS action
      FROM c
), written AS (
    INSERT INTO consumers_doorbellstate AS d (consumer_id, armed, mark, rang_at, next_ring_at, rings, failures)
    SELECT x.id, x.action = 'arm',
           CASE WHEN x.action = 'ring' THEN (SELECT q.id FROM jobs_job q
                                              WHERE q.consumer_id BETWEEN x.id AND x.id
                                                AND q.status BETWEEN 1001 AND 1001
                                              ORDER BY q.consumer_id, q.status, q.id DESC LIMIT 1) END,
           CASE WHEN x.action = 'ring' THEN now() END,
           CASE WHEN x.action = 'ring' THEN now() + x.notify_interval * interval '1 second' END,
           CASE WHEN x.action = 'ring' THEN 1 ELSE 0 END, 0
      FROM decided x WHERE x.action IN ('arm', 'ring')
    ON CONFLICT (consumer_id) DO UPDATE SET
        armed = EXCLUDED.armed,
        mark = COALESCE(EXCLUDED.mark, d.mark),
        rang_at = COALESCE(EXCLUDED.rang_at, d.rang_at),
        next_ring_at = COALESCE(EXCLUDED.next_ring_at, d.next_ring_at),
        rings = d.rings + EXCLUDED.rings
     WHERE EXCLUDED.armed OR d.next_ring_at IS NULL OR d.next_ring_at <= now()
    RETURNING d.consumer_id, d.armed, d.rang_at, d.next_ring_at
)
SELECT w.consumer_id, w.rang_at, ch.channel_id, c.consumer_id, c.callback_url, c.token, c.signing_secret,
       c.previous_signing_secret, c.previous_secret_expires_at,
       (SELECT o.created_at FROM jobs_job o
         WHERE o.consumer_id BETWEEN w.consumer_id AND w.consumer_id AND o.status BETWEEN 1001 AND 1001
         ORDER BY o.consumer_id DESC, o.status DESC, o.id LIMIT 1),
       extract(epoch FROM w.next_ring_at - now())::float8
  FROM written w JOIN consumers_consumer c ON c.id = w.consumer_id JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE NOT w.armed
UNION ALL
SELECT x.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM x.next_ring_at - now())::float8
  FROM decided x WHERE x.action = 'wait';

-- doorbell_failed --
-- index: pk
-- Re-arm the doorbells whose ring failed, unless they rang again since.
UPDATE consumers_doorbellstate d SET armed = true, failures = d.failures + 1
  FROM unnest(%s::bigint[], %s::timestamptz[]) f(id, at)
 WHERE d.consumer_id = f.id AND d.rang_at = f.at;

-- doorbell_prune --
-- index: pk
-- Drop the doorbell state of consumers that were deleted or no longer have a doorbell.
DELETE FROM consumers_doorbellstate d WHERE NOT EXISTS (
    SELECT 1 FROM consumers_consumer c WHERE c.id = d.consumer_id AND c.type = 'pull'
       AND c.callback_url <> '');

-- doorbell_consumers --
-- index: none (a small table, read whole)
-- The pull consumers with a doorbell (a callback URL).
SELECT id FROM consumers_consumer WHERE type = 'pull' AND callback_url <> '';

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
-- index: job_consumer_status
-- hot
-- The oldest QUEUED job of each consumer: one backward probe of job_consumer_status (consumer,
-- status, id DESC). Ranges, not equalities, keep the sort keys only that index provides: ordered by
-- id alone, a correlated probe walked the primary key over every other consumer's jobs (3.9 s per
-- dashboard at a 1M backlog).
SELECT c.id, extract(epoch FROM now() - (
           SELECT j.created_at FROM jobs_job j
            WHERE j.consumer_id BETWEEN c.id AND c.id AND j.status BETWEEN 1001 AND 1001
            ORDER BY j.consumer_id DESC, j.status DESC, j.id LIMIT 1))
  FROM unnest(%(ids)s::bigint[]) AS c(id);

-- overdue_inflight --
-- index: job_inflight_deadline|job_inflight_consumer
-- hot
-- In-flight jobs past their deadline by more than a grace (capped): any means the sweep is not running.
SELECT count(*) FROM (
    SELECT 1 FROM jobs_job
     WHERE status = 1002 AND deadline < now() - %(grace)s * interval '1 second'
     LIMIT %(cap)s) x;

-- db_now --
-- index: none (no table)
-- The database clock.
SELECT now();

-- dead_id_batch --
-- index: job_consumer_status
-- The next batch of a consumer's dead job ids after %s, ascending (the requeue_dead command).
SELECT id FROM jobs_job WHERE consumer_id = %s AND status = %s AND id > %s
   AND (%s::bigint[] IS NULL OR id = ANY(%s::bigint[])) ORDER BY id LIMIT %s;

-- expire_messages --
-- index: job_queued_expiry
-- hot
-- Expiry sweep (jobs.expiry): one batch of QUEUED jobs whose message expired -> DEAD, reason
-- ``expired`` (history by the trigger). job_queued_expiry is partial (QUEUED rows with an expiry, by
-- expires_at), so a sweep that finds nothing costs one index probe however large the backlog. Rows
-- locked SKIP LOCKED (a claim in progress cannot pick an expired row anyway) and moved by primary
-- key (``+ 0`` keeps the status check on the row, as in expire_all).
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

-- replay_chunk --
-- index: message_channel_received, job_unique_per_consumer, pk
-- One chunk of a replay (jobs.replay): the next %(limit)s messages of the channel in the window,
-- walked by keyset on message_channel_received (channel_id, received_at, id); this consumer's job of
-- each message found through job_unique_per_consumer (message_id, consumer_id), then moved by
-- primary key. DELIVERED (unless only_failed) and DEAD jobs go back to QUEUED, retry count 0 (rows
-- locked SKIP LOCKED: a job some other statement holds right now is skipped, never waited for); a
-- message without a job of this consumer gets a fresh QUEUED job (unless only_failed), if the
-- consumer's messageTypes match and it has not expired. QUEUED and INFLIGHT jobs are skipped, and
-- so are partitioned jobs and messages (a job put back below its partition's gate could never run
-- again). The moves' history is the trigger's (last_reason 'replay'); the trigger covers UPDATE and
-- DELETE only, so the new jobs' NULL -> QUEUED rows (reason 'replay') are written here.
WITH m AS MATERIALIZED (
    -- a range on channel_id keeps it in the sort keys: only message_channel_received gives this order
    SELECT id, priority, received_at, type, expires_at FROM broker_message
     WHERE channel_id BETWEEN %(channel)s AND %(channel)s
       AND (received_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
       AND received_at <= %(until)s::timestamptz
     ORDER BY channel_id, received_at, id LIMIT %(limit)s
), cur AS MATERIALIZED (
    -- per message by job_unique_per_consumer (LIMIT 1: a nested loop, never a hash of every job)
    SELECT j.id, j.message_id, j.status, j.partition_id, j.expires_at
      FROM m CROSS JOIN LATERAL (
          SELECT j.id, j.message_id, j.status, j.partition_id, j.expires_at FROM jobs_job j
           WHERE j.message_id = m.id AND j.consumer_id = %(consumer)s LIMIT 1) j
), pick AS MATERIALIZED (
    SELECT p.id, p.status FROM jobs_job p
     WHERE p.id = ANY(ARRAY(SELECT id FROM cur WHERE partition_id IS NULL  -- an expired message stays dead
                                                 AND (expires_at IS NULL OR expires_at > now())
                                                 AND (status = 1004 OR (status = 1003 AND NOT %(only_failed)s))))
       AND p.status + 0 IN (1004, 1003) AND p.partition_id IS NULL
       FOR UPDATE SKIP LOCKED
), ud AS (
    UPDATE jobs_job j SET status = 1001, retry_count = 0, status_changed_at = now(), next_attempt_at = now(),
                          deadline = NULL, last_reason = 'replay'
     WHERE j.id = ANY(ARRAY(SELECT id FROM pick WHERE status = 1003)) AND j.status + 0 = 1003
    RETURNING j.id
), ux AS (
    UPDATE jobs_job j SET status = 1001, retry_count = 0, status_changed_at = now(), next_attempt_at = now(),
                          deadline = NULL, last_reason = 'replay'
     WHERE j.id = ANY(ARRAY(SELECT id FROM pick WHERE status = 1004)) AND j.status + 0 = 1004
    RETURNING j.id
), ins AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count, next_attempt_at,
                          incremental_timeout, status_changed_at, created_at, expires_at, last_reason)
    SELECT src.id, %(consumer)s, %(channel)s, 1001, src.priority, 0, now(), 0, now(), now(), src.expires_at, 'replay'
      FROM m src JOIN consumers_consumer c ON c.id = %(consumer)s LEFT JOIN LATERAL (
          SELECT 1 AS yes FROM jobs_job o WHERE o.message_id = src.id AND o.partition_id IS NOT NULL LIMIT 1) pt ON true
     WHERE NOT %(only_failed)s AND pt.yes IS NULL
       AND (src.expires_at IS NULL OR src.expires_at > now())
       AND (c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes, as at fan-out
       AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.message_id = src.id)
     ORDER BY src.id
    ON CONFLICT (message_id, consumer_id) DO NOTHING
    RETURNING id
), h AS (
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT id, NULL, 1001, 0, 'replay', now() FROM ins
), n AS (
    SELECT pg_notify('broker_jobs', %(consumer)s::text)
     WHERE EXISTS (SELECT 1 FROM ud) OR EXISTS (SELECT 1 FROM ux) OR EXISTS (SELECT 1 FROM ins)
), last AS (
    SELECT received_at, id FROM m ORDER BY received_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM ud) + (SELECT count(*) FROM ux) + (SELECT count(*) FROM ins),
       (SELECT received_at FROM last), (SELECT id FROM last), (SELECT count(*) FROM n);

-- circuit_consumers --
-- index: pk
-- The consumers whose circuit changed in a push record, with their circuit (jobs.circuit advisories).
SELECT c.id, c.consumer_id, ch.channel_id, cb.failures, c.circuit_breaker_failures
  FROM consumers_consumer c JOIN broker_channel ch ON ch.id = c.channel_id
  LEFT JOIN consumers_circuit cb ON cb.consumer_id = c.id
 WHERE c.id = ANY(%(consumers)s);

-- circuit_close --
-- index: pk
-- The operator's "close now": failures forgotten (the row by its primary key consumer_id); returns
-- the state it had when it was open or counting, no row otherwise. Waiting push dispatchers woken.
WITH old AS (SELECT state FROM consumers_circuit WHERE consumer_id = %(consumer)s FOR UPDATE),
u AS (
    UPDATE consumers_circuit cb SET state = 0, failures = 0, since = now(), next_probe_at = NULL
      FROM old WHERE cb.consumer_id = %(consumer)s AND (old.state <> 0 OR cb.failures > 0)
    RETURNING old.state
)
SELECT u.state, pg_notify('broker_jobs', %(consumer)s::text) FROM u;

-- circuit_read --
-- index: pk
-- One consumer's circuit (consumer GET, admin).
SELECT state, since, failures FROM consumers_circuit WHERE consumer_id = %(consumer)s;

-- circuits_open --
-- index: none (consumers_circuit holds one row per push consumer that ever failed: a small table)
-- Consumers whose circuit is OPEN or HALF_OPEN (/metrics).
SELECT consumer_id FROM consumers_circuit WHERE state <> 0;

-- job_payload_head --
-- index: pk (jobs_job, then broker_message)
-- The admin's preview of a job's own payload (set by a handler-driven gate move): at most %s bytes,
-- its size, and its message's content type. Params: limit, id. No row when the job has none.
SELECT substring(j.payload FROM 1 FOR %s), octet_length(j.payload), m.content_type
  FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
 WHERE j.id = %s AND j.payload IS NOT NULL;

-- doorbell_lock --
-- index: none (an advisory lock)
-- The one doorbell ringer: a session lock on its dedicated connection (freed when that closes).
SELECT pg_try_advisory_lock(hashtext(%s));

-- dispatcher_slot_lock --
-- index: none (an advisory lock)
-- A push dispatcher slot (cluster key, slot number): a session lock on the slot's dedicated
-- connection, so a worker killed with SIGKILL frees its slot with its connection.
SELECT pg_try_advisory_lock(hashtext(%s), %s);

-- plan_sample_consumers --
-- index: none (every consumer: a registry-sized table; counters by counter_key)
-- The consumers the plan check explains with (jobs.plans.sample_live): each one's type, channel,
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
-- index: job_consumer_status
-- Some jobs of a consumer in a status (the plan check's samples).
SELECT id FROM jobs_job WHERE consumer_id = %(consumer)s AND status = %(status)s
 ORDER BY consumer_id DESC, status DESC, id DESC LIMIT %(n)s;

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
-- The latest plan check of every statement (jobs.plans.plan_results_store); statements no longer
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
