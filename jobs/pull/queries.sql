-- Named SQL of jobs.pull (format: broker.db.queries): authentication, claims, the spec path,
-- acks, waiting pulls, priority groups, the doorbell.
-- Job statuses are literals (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition
-- AVAILABLE 1) wherever a generic plan must use a partial index: only a literal lets a plan (a
-- cached generic plan above all) use the partial indexes that hold one status (job_claim,
-- job_inflight_deadline, ...). History rows are written by the jobs_job trigger (migration 0017)
-- from ``last_reason``, which every status-changing UPDATE sets.
--
-- Partition gating in the claims (jobs.partitions): a partitioned job is claimable only at its
-- partition's current gate while the partition is AVAILABLE (push: also leased by the claiming
-- worker); on an ``ordered`` consumer only the lowest-id unfinished job of the partition, and none
-- while another is in flight. Non-partitioned jobs pay one ``partition_id IS NULL`` test (the claims
-- keep walking job_push_fresh; the subqueries run for partitioned rows only, and the partition test is a
-- correlated scalar subquery by primary key: as an EXISTS PostgreSQL may turn it into a hashed
-- subplan that reads every AVAILABLE partition per claim). The same predicate is written out in
-- claim_pull and both branches of claim_push.

-- pull_claimable --
-- fragment
-- What each of claim_pull's walks asks of a job (``j``) besides its walk's own index conditions:
-- due, not expired, and when it is in a partition, the partition open (not paused) at the job's gate
-- and, for an ordered consumer (``room.ordered``), no job of that gate before it queued or in flight.
j.next_attempt_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry: never hand out an expired message
           AND (j.partition_id IS NULL OR (
            (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
                AND pt.status = 1) = j.gate
            AND NOT ((SELECT room.ordered FROM room) AND EXISTS (
                SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
                   AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))

-- pull_by_priority --
-- fragment
-- The end of claim_pull's walks of first attempts: by priority then id (job_push_fresh), at most
-- the literal bound (1000 = jobs.pull.claim.PULL_BATCH_MAX) locked, then the consumer's room.
ORDER BY j.priority DESC, j.id
         LIMIT 1000  -- bound: jobs.pull.claim.PULL_BATCH_MAX
           FOR UPDATE SKIP LOCKED) x LIMIT (SELECT room.n FROM room)) y

-- claim_pull --
-- index: job_push_fresh, job_push_retry
-- hot
-- Claim up to %(limit)s due QUEUED jobs of one pull consumer, priority then oldest first, within
-- its room (not paused, maxAckPending from the maintained counters), partitioned jobs only at their
-- partition's gate, and (with %(max_bytes)s) cut before the payloads add up to more than that
-- (always at least one job); SKIP LOCKED picks, the UPDATE by primary key (= ANY(ARRAY(...)): a join
-- with picked hashed every job in the generic plan) moves them to INFLIGHT with a new receipt (the
-- claim's, jobs.pull.ack). Statuses are literals so a generic plan can use the partial indexes.
-- First attempts are walked by priority then id (job_push_fresh), retries by due time
-- (job_push_retry), as the push claim does: the room's first jobs of both, by priority then id.
-- Each walk starts at a floor (jobs.state.floors, issue 35), so a held snapshot's dead entries are
-- not walked again by every claim: (%(fp)s, %(fi)s), a priority level and the id below which that
-- level holds only jobs that left the queue (levels above it are walked from their start, levels
-- below it after it; a full walk passes (2147483647, 0)), and %(rsince)s for the retries (NULL: a
-- full walk). ``fl`` and ``rl`` are the first job at or past each floor (due or not, locked or not):
-- the claim walks from there, and the last row returns them as the next floors (with the id
-- sequence's value, and the retry floor at most the clock less %(lag)s seconds).
-- Two limits: a literal bound inside (1000 = jobs.pull.claim.PULL_BATCH_MAX, the most one pull
-- claims), the consumer's room outside. A LIMIT the planner cannot read (a parameter, a subquery) is
-- estimated at 10 % of the rows: with one consumer owning a 1M backlog that is ~100,000 rows, and a
-- sequential scan plus a sort looked cheaper than this index walk (issue 21). The outer LIMIT of
-- each walk pulls only as many rows as the room allows, so only those are locked.
WITH fl AS MATERIALIZED (
    SELECT f.priority, f.id FROM (
        (SELECT j.priority, j.id FROM jobs_job j
          WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count = 0 AND j.priority > %(fp)s::int
          ORDER BY j.priority DESC, j.id LIMIT 1)
        UNION ALL
        (SELECT j.priority, j.id FROM jobs_job j
          WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count = 0 AND j.priority = %(fp)s::int AND j.id >= %(fi)s::bigint
          ORDER BY j.priority DESC, j.id LIMIT 1)
        UNION ALL
        (SELECT j.priority, j.id FROM jobs_job j
          WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count = 0 AND j.priority < %(fp)s::int
          ORDER BY j.priority DESC, j.id LIMIT 1)
    ) f ORDER BY f.priority DESC, f.id LIMIT 1
), rl AS MATERIALIZED (
    SELECT r.next_attempt_at AS t FROM jobs_job r
     WHERE r.consumer_id = %(consumer)s::bigint AND r.status = 1001 AND r.retry_count > 0
       AND r.next_attempt_at >= COALESCE(%(rsince)s::timestamptz, '-infinity'::timestamptz)
     ORDER BY r.next_attempt_at LIMIT 1
), room AS MATERIALIZED (
    SELECT CASE WHEN k.paused THEN 0 ELSE GREATEST(0, LEAST(%(limit)s::bigint,
            k.max_ack_pending - COALESCE((SELECT sum(x.n) FROM (
                SELECT count AS n FROM broker_counter
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002
                UNION ALL
                SELECT delta FROM broker_counterdelta
                 WHERE scope = 1 AND owner_id = k.id AND status = 1002) x), 0)))::bigint END AS n,
           k.ordered
      FROM consumers_consumer k WHERE k.id = %(consumer)s::bigint
), c AS (
    SELECT b.id, b.priority, b.message_id, b.payload FROM (
        SELECT * FROM (SELECT * FROM (
        SELECT j.id, j.priority, j.message_id, j.payload FROM jobs_job j
         WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count = 0 AND j.priority = (SELECT fl.priority FROM fl) AND j.id >= (SELECT fl.id FROM fl)
           AND {{pull_claimable}}
         {{pull_by_priority}}
        UNION ALL
        SELECT * FROM (SELECT * FROM (
        SELECT j.id, j.priority, j.message_id, j.payload FROM jobs_job j
         WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count = 0 AND j.priority < (SELECT fl.priority FROM fl)
           AND {{pull_claimable}}
         {{pull_by_priority}}
        UNION ALL
        SELECT * FROM (SELECT * FROM (
        SELECT j.id, j.priority, j.message_id, j.payload FROM jobs_job j
         WHERE j.consumer_id = %(consumer)s::bigint AND j.status = 1001 AND j.retry_count > 0 AND j.next_attempt_at >= (SELECT rl.t FROM rl)
           AND {{pull_claimable}}
         ORDER BY j.next_attempt_at
         LIMIT 1000  -- bound: jobs.pull.claim.PULL_BATCH_MAX
           FOR UPDATE SKIP LOCKED) x LIMIT (SELECT room.n FROM room)) y
    ) b
     ORDER BY b.priority DESC, b.id
     LIMIT (SELECT room.n FROM room)
), s AS (
    -- max_bytes: the running payload sum in claim order, from the stored sizes (no detoasting), the
    -- message's by primary key (a join let a plan hash the whole message table); without max_bytes
    -- the CASE never runs its subquery
    SELECT c.id, row_number() OVER w AS n,
           sum(CASE WHEN %(max_bytes)s::bigint IS NULL THEN 0 ELSE COALESCE(octet_length(c.payload),
               (SELECT octet_length(m.payload) FROM broker_message m WHERE m.id = c.message_id)) END) OVER w
               AS running
      FROM c
    WINDOW w AS (ORDER BY c.priority DESC, c.id)
), picked AS (
    SELECT id FROM s WHERE n = 1 OR %(max_bytes)s::bigint IS NULL OR running <= %(max_bytes)s::bigint
),
u AS (
    UPDATE jobs_job j SET
        status = 1002,
        status_changed_at = now(),
        deadline = now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, j.incremental_timeout)) * interval '1 second',
        incremental_timeout = COALESCE(%(inc)s::float8, j.incremental_timeout),
        last_reason = %(reason)s::text,
        receipt = nextval('jobs_job_receipt_seq')
     WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = 1001
    RETURNING j.id, j.message_id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
              j.partition_id, j.gate, j.payload, j.receipt
)
(SELECT u.id, u.priority, u.retry_count, u.incremental_timeout, u.deadline,
        m.message_id, COALESCE(u.payload, m.payload), m.content_type, m.headers,
        CASE WHEN u.partition_id IS NOT NULL
             THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type,
        u.receipt, m.traceparent, m.tracestate,  -- this claim's receipt; trace context (broker.tracing)
        NULL::int, NULL::bigint, NULL::bigint, NULL::timestamptz
   FROM u JOIN broker_message m ON m.id = u.message_id
  ORDER BY u.priority DESC, u.id)
UNION ALL
-- last: the next floors (jobs.state.floors): the first live fresh job's level and id, the id
-- sequence, the retry floor
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT fl.priority FROM fl), (SELECT fl.id FROM fl), (SELECT last_value FROM jobs_job_id_seq),
       LEAST((SELECT rl.t FROM rl), now() - %(lag)s::float8 * interval '1 second');

-- extend --
-- index: pk
-- hot
-- Push the deadline of a pull consumer's in-flight jobs (not a transition). ``+ 0``: status and
-- consumer checked on the row, so only the primary key serves it. With %(receipt)s only the claim
-- it names is extended (a late progress of an earlier holder changes nothing, jobs.pull.ack).
UPDATE jobs_job SET
    deadline = GREATEST(deadline,
                        now() + (%(timeout)s::float8 + COALESCE(%(inc)s::float8, incremental_timeout)) * interval '1 second'),
    incremental_timeout = COALESCE(%(inc)s::float8, incremental_timeout)
 WHERE id = ANY(%(ids)s::bigint[]) AND status + 0 = 1002 AND consumer_id + 0 = %(consumer)s::bigint
   AND (%(receipt)s::bigint IS NULL OR receipt = %(receipt)s::bigint)
RETURNING id, deadline, retry_count;

-- job_claim_state --
-- index: pk
-- A consumer's job's status and current receipt: why a progress changed nothing (stale receipt, or
-- not in flight).
SELECT status, receipt FROM jobs_job WHERE id = %(job)s::bigint AND consumer_id + 0 = %(consumer)s::bigint;

-- pull_move_auth --
-- index: pk
-- hot
-- The spec path's state change in one round trip: the auth row (channel, consumer, job) and the
-- job's move when the tokens match (md5 digests compared), the consumer is a pull consumer and the
-- job is in one of %(from_s)s; never to INFLIGHT on a consumer with a priority policy. A move to
-- INFLIGHT is a claim: a new receipt (jobs.pull.ack), returned last.
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
        last_reason = %(reason)s::text,
        receipt = CASE WHEN %(to_s)s::smallint = 1002 THEN nextval('jobs_job_receipt_seq') ELSE j.receipt END
      FROM a
     WHERE j.id = a.j_id AND j.consumer_id = a.c_pk AND a.c_type = 'pull'
       AND j.status = a.j_status AND a.j_status = ANY(%(from_s)s::smallint[])
       AND (%(to_s)s::smallint <> 1002 OR j.expires_at IS NULL OR j.expires_at > now())  -- expiry
       AND (a.c_policy = 'none' OR %(to_s)s::smallint <> 1002)
       AND md5(a.ch_token) = md5(%(ch_token)s::text) AND md5(a.c_token) = md5(%(c_token)s::text)
    RETURNING j.id, j.status, j.retry_count, j.partition_id, j.receipt
)
SELECT a.*, (SELECT count(*) FROM u), (SELECT u.partition_id FROM u),
       -- %(async_commit)s: commit without waiting for the WAL flush (jobs.pull.spec): SET LOCAL for
       -- the statement's own transaction (autocommit), read when it commits
       CASE WHEN %(async_commit)s::bool THEN set_config('synchronous_commit', 'off', true) END,
       (SELECT u.receipt FROM u) FROM a;

-- ack --
-- index: pk
-- hot
-- A pull consumer's outcomes for many in-flight jobs (the batch ack): INFLIGHT -> DELIVERED /
-- DEAD / QUEUED (retry + 1, DEAD past max_retry); waiting pulls are notified of requeues. An item
-- with a receipt moves only the claim it names (a late ack of an earlier holder changes nothing);
-- the jobs that did not move come back with their current status, receipt and retry count.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(to_s)s::smallint[], %(delay)s::float8[], %(receipts)s::bigint[])
           AS v(id, to_s, delay, receipt)
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
       AND (v.receipt IS NULL OR j.receipt = v.receipt)
    RETURNING j.id, j.status, j.retry_count, j.partition_id
), n AS (
    SELECT pg_notify('broker_jobs', %(consumer)s::text) FROM u WHERE status = 1001 LIMIT 1
)
SELECT v.id, u.status, u.retry_count, c.status, (SELECT count(*) FROM n), u.partition_id, c.receipt, c.retry_count
  FROM v LEFT JOIN u ON u.id = v.id
         LEFT JOIN jobs_job c ON u.id IS NULL AND c.id = v.id AND c.consumer_id + 0 = %(consumer)s::bigint;

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
-- index: job_push_fresh, job_push_retry
-- hot
-- settings: enable_bitmapscan=off
-- Due QUEUED jobs of a consumer in claim order (first attempts by priority then id, retries by due
-- time, as claim_pull walks them), each message by primary key (LATERAL ... LIMIT 1 is never turned
-- into a join: a generic plan hash-joined the whole message table, 600 ms at 1M). A literal bound
-- inside (100 = the largest limit), the caller's limit outside: a generic plan estimates "LIMIT $n"
-- at 10 % of the rows, and with one consumer owning a 1M backlog it chose a parallel sequential scan
-- and a sort (204 ms against 0.16 ms, issue 21). No bitmap scans: for a consumer the statistics
-- call small, the retries' walk was planned as a bitmap scan of every due retry and a sort, a cost
-- that grows with the retries due after an outage (the walk in index order stops at the bound).
SELECT j.id, j.priority, j.incremental_timeout, m.message_id, m.payload, m.content_type, m.headers, m.type,
       m.traceparent, m.tracestate
  FROM (SELECT b.id, b.priority, b.incremental_timeout, b.message_id FROM (
        (SELECT id, priority, incremental_timeout, message_id FROM jobs_job
          WHERE consumer_id = %(consumer)s::bigint AND status = 1001 AND retry_count = 0 AND next_attempt_at <= now()
            AND (expires_at IS NULL OR expires_at > now())  -- expiry: never listed once expired
          ORDER BY priority DESC, id LIMIT 100  -- bound: jobs.pull.fields.QUEUED_JOBS_MAX
        ) UNION ALL (
        SELECT id, priority, incremental_timeout, message_id FROM jobs_job
          WHERE consumer_id = %(consumer)s::bigint AND status = 1001 AND retry_count > 0
            AND next_attempt_at <= now() AND (expires_at IS NULL OR expires_at > now())
          ORDER BY next_attempt_at LIMIT 100  -- bound: jobs.pull.fields.QUEUED_JOBS_MAX
        )
        ) b ORDER BY b.priority DESC, b.id LIMIT %(limit)s::int) j
  CROSS JOIN LATERAL (SELECT message_id, payload, content_type, headers, type, traceparent, tracestate FROM broker_message
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
-- index: pullwaiter_live
-- A waiting pull registers (expired waiters of the consumer removed); then pull_next says when to
-- look again.
WITH gc AS (
    DELETE FROM consumers_pullwaiter WHERE consumer_id = %(consumer)s AND expires_at < now() - interval '5 seconds'
)
INSERT INTO consumers_pullwaiter ("group", priority, pin_id, min_pending, min_ack_pending, batch, max_bytes,
                                  arrived_at, expires_at, consumer_id)
VALUES (%(group)s, %(priority)s, %(pin)s, NULL, NULL, %(batch)s, %(max_bytes)s,
        now(), now() + %(expires)s * interval '1 second', %(consumer)s)
RETURNING id;

-- pull_next --
-- index: job_push_fresh, job_push_retry, job_inflight_consumer
-- hot
-- When a waiting pull (or a priority group's dispatcher) should look again: seconds until the
-- earliest delayed job is due and until the earliest in-flight deadline. Partitioned jobs count as
-- due only while delayed (a gate advance NOTIFYs instead). Each walk starts at a floor
-- (jobs.state.floors): the consumer's claim floor (%(fp)s, %(fi)s) for its fresh jobs, %(rsince)s and
-- %(dsince)s (NULL: a full walk) for its retries and in-flight deadlines, whose next floors come
-- back last (the earliest value seen, at most the clock less %(lag)s seconds).
WITH r AS MATERIALIZED (
    SELECT min(r.next_attempt_at) AS t FROM jobs_job r
     WHERE r.consumer_id = %(consumer)s::bigint AND r.status = 1001 AND r.retry_count > 0
       AND r.next_attempt_at >= COALESCE(%(rsince)s::timestamptz, '-infinity'::timestamptz)
       AND (r.partition_id IS NULL OR r.next_attempt_at > now())
       AND (r.expires_at IS NULL OR r.expires_at > now())
), d AS MATERIALIZED (
    SELECT min(i.deadline) AS t FROM jobs_job i
     WHERE i.consumer_id = %(consumer)s::bigint AND i.status = 1002
       AND i.deadline >= COALESCE(%(dsince)s::timestamptz, '-infinity'::timestamptz)
)
SELECT
       EXTRACT(EPOCH FROM LEAST(
           (SELECT x.next_attempt_at FROM (
            (SELECT f.priority, f.id, f.next_attempt_at FROM jobs_job f
              WHERE f.consumer_id = %(consumer)s::bigint AND f.status = 1001 AND f.retry_count = 0 AND f.priority > %(fp)s::int
                AND f.partition_id IS NULL AND (f.expires_at IS NULL OR f.expires_at > now())
              ORDER BY f.priority DESC, f.id LIMIT 1)
            UNION ALL
            (SELECT f.priority, f.id, f.next_attempt_at FROM jobs_job f
              WHERE f.consumer_id = %(consumer)s::bigint AND f.status = 1001 AND f.retry_count = 0 AND f.priority = %(fp)s::int AND f.id >= %(fi)s::bigint
                AND f.partition_id IS NULL AND (f.expires_at IS NULL OR f.expires_at > now())
              ORDER BY f.priority DESC, f.id LIMIT 1)
            UNION ALL
            (SELECT f.priority, f.id, f.next_attempt_at FROM jobs_job f
              WHERE f.consumer_id = %(consumer)s::bigint AND f.status = 1001 AND f.retry_count = 0 AND f.priority < %(fp)s::int
                AND f.partition_id IS NULL AND (f.expires_at IS NULL OR f.expires_at > now())
              ORDER BY f.priority DESC, f.id LIMIT 1)
            ) x ORDER BY x.priority DESC, x.id LIMIT 1),
           (SELECT t FROM r)) - now()),
       EXTRACT(EPOCH FROM (SELECT t FROM d) - now()),
       LEAST((SELECT t FROM r), now() - %(lag)s::float8 * interval '1 second'),
       LEAST((SELECT t FROM d), now() - %(lag)s::float8 * interval '1 second');

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
-- index: job_push_fresh, job_push_retry
-- hot
-- Is a job due? The claim's own first step (an EXISTS was planned as a scan of the whole table with
-- the statistics of a smaller one): a first attempt (job_push_fresh), or a retry whose time came
-- (job_push_retry).
SELECT (SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1001 AND retry_count = 0
                                  AND next_attempt_at <= now()
                                  AND (expires_at IS NULL OR expires_at > now())  -- expiry
         ORDER BY priority DESC, id LIMIT 1) IS NOT NULL
    OR (SELECT id FROM jobs_job WHERE consumer_id = %s AND status = 1001 AND retry_count > 0
                                  AND next_attempt_at <= now()
                                  AND (expires_at IS NULL OR expires_at > now())
         ORDER BY next_attempt_at LIMIT 1) IS NOT NULL;

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
-- The jobs a group dispatch handed a waiter, still INFLIGHT, with their messages (and receipts).
SELECT j.id, j.priority, j.retry_count, j.incremental_timeout, j.deadline,
       m.message_id, COALESCE(j.payload, m.payload), m.content_type, m.headers,
       (SELECT pt.key FROM jobs_partition pt WHERE pt.id = j.partition_id), j.gate, m.type,  -- partitions, type
       j.receipt, m.traceparent, m.tracestate  -- receipt; trace context
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
-- index: job_push_fresh, job_claim
-- hot
-- Decide and record in one statement which pull consumers with a callback URL ring now (all, or
-- %(ids)s): ready (a due QUEUED job: a first attempt, job_push_fresh, or a due retry, job_push_retry)
-- and not paused, and armed, or the job marked at the last ring is gone; throttled by
-- notify_interval. The mark and the oldest queued job are probes of job_claim (consumer, id) with a
-- range on the consumer, not an equality: with an equality the ORDER BY collapses to "id" and, in a
-- correlated subquery, the planner may walk the primary key filtering every other consumer's rows
-- (measured: 16 ms per 100k rows).
WITH c AS MATERIALIZED (
    SELECT c.id, c.paused, c.notify_interval, d.consumer_id IS NULL AS fresh, d.armed, d.mark, d.next_ring_at,
           ((SELECT j.id FROM jobs_job j WHERE j.consumer_id = c.id AND j.status = 1001 AND j.retry_count = 0
                AND j.next_attempt_at <= now() AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
              ORDER BY j.priority DESC, j.id LIMIT 1) IS NOT NULL
            OR (SELECT j.id FROM jobs_job j WHERE j.consumer_id = c.id AND j.status = 1001 AND j.retry_count > 0
                AND j.next_attempt_at <= now() AND (j.expires_at IS NULL OR j.expires_at > now())
              ORDER BY j.next_attempt_at LIMIT 1) IS NOT NULL) AS ready
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
                                              WHERE q.consumer_id BETWEEN x.id AND x.id AND q.status = 1001
                                              ORDER BY q.consumer_id DESC, q.id DESC LIMIT 1) END,
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
         WHERE o.consumer_id BETWEEN w.consumer_id AND w.consumer_id AND o.status = 1001
         ORDER BY o.consumer_id, o.id LIMIT 1),
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

-- doorbell_lock --
-- index: none (an advisory lock)
-- The one doorbell ringer: a session lock on its dedicated connection (freed when that closes).
SELECT pg_try_advisory_lock(hashtext(%s));

-- job_traces --
-- index: pk
-- The trace context of jobs' messages, by job primary key: only when OpenTelemetry records the
-- spans of a pull ack (broker.tracing), never otherwise.
SELECT j.id, m.traceparent, m.tracestate
  FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
 WHERE j.id = ANY(%(ids)s::bigint[]);
