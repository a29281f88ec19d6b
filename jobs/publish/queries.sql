-- Named SQL of jobs.publish (format: broker.db.queries): authentication, fan-out, scheduled
-- messages, replay.
-- Job statuses are literals (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition
-- AVAILABLE 1) wherever a generic plan must use a partial index: only a literal lets a plan (a
-- cached generic plan above all) use the partial indexes that hold one status (job_claim,
-- job_inflight_deadline, ...). History rows are written by the jobs_job trigger (migration 0017)
-- from ``last_reason``, which every status-changing UPDATE sets.

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

-- producer_rate_grant --
-- index: pk
-- Spend up to %(n)s tokens of the producer's bucket, as many as it holds, in one statement: the
-- publishing batch's messages of one producer (jobs.publish.grouped), in their order, as separate
-- publishes would. Returns how many were granted (no row: none). FOR UPDATE reads the latest version
-- of the row once its lock is ours, so concurrent batches across processes never spend a token twice.
WITH bucket AS (
    SELECT id, LEAST(%(burst)s::float8,
                     COALESCE(rate_tokens + extract(epoch FROM now() - rate_at) * %(rate)s::float8,
                              %(burst)s::float8)) AS held
      FROM broker_producer WHERE id = %(producer)s::bigint FOR UPDATE
), granted AS (
    SELECT id, held, LEAST(%(n)s::int, GREATEST(0, floor(held)::int)) AS n FROM bucket
)
UPDATE broker_producer p SET rate_tokens = g.held - g.n, rate_at = now()
  FROM granted g
 WHERE p.id = g.id AND g.n > 0
RETURNING g.n;

-- publisher_backend_state --
-- index: none (pg_stat_activity)
-- The state of the publishing thread's session (jobs.publish.grouped: a batch running for a second
-- is slow while its backend works on it, 'active'; stuck when it is idle or gone).
SELECT state FROM pg_stat_activity WHERE pid = %(pid)s::int;

-- delivery_lag --
-- index: none (a small table, read whole)
-- The push deliveries' lag, as the dispatcher engines alive now last reported it (jobs.push.lag):
-- the largest, among the reports of the last %(fresh)s seconds (an older one is from an engine that
-- stopped reporting: it claims nothing behind, or it is gone). jobs_pushowner holds a row per live
-- engine. Read by the publishing thread at most every jobs.publish.admission.READ_EVERY.
SELECT COALESCE(max(lag), 0)::float8 FROM jobs_pushowner WHERE lag_at > now() - %(fresh)s::float8 * interval '1 second';

-- job_wanted --
-- fragment
-- The end of insert_one's and insert_messages's ``jobs_created``: which consumers (``c``) of a stored
-- message (``src``, with its payload as jsonb and headers by lower-case name when the channel has a
-- filtered consumer) get a job, in message order, and the statement's answer.
(c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes
       AND CASE WHEN c.filter_plan IS NULL THEN true  -- filters: only filtered consumers evaluate one
                ELSE broker_filter_match(c.filter_plan, src.body, COALESCE(src.headers, '{}')) END
     ORDER BY src.id, c.id  -- job ids follow message order: pulls are "oldest first" by job id
    RETURNING consumer_id
)
-- the consumers that got jobs, for the wake-up sent after the commit (broker.db.notify: no NOTIFY
-- inside the durable transaction)
SELECT m.message_id, (SELECT array_agg(DISTINCT consumer_id) FROM jobs_created) FROM m

-- insert_one --
-- index: message_unique_per_channel
-- hot
-- insert_messages for one message without a partition key, the common single publish, with its
-- values as parameters rather than arrays (measured: 0.07-0.13 ms less per statement). One message and
-- its fan-out in one statement: the message (a duplicate id inserts nothing), one
-- QUEUED job per consumer of its channel whose messageTypes and filter match (jobs_created). Filters (consumers.filters): ``b`` is the payload as jsonb and
-- the headers by lower-case name, computed once per message and only when the channel has a
-- filtered consumer (consumer_filtered: one probe of an index of the filtered consumers only);
-- ``broker_filter_match`` (consumers migration 0011) runs for filtered consumers only. Returns the
-- consumers that got jobs: their wake-up is sent after the commit (broker.db.notify).
WITH m AS (
    INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                headers, status, received_at, dispatched_at, type, expires_at, traceparent, tracestate)
    VALUES (%(channel)s::bigint, %(mid)s::text, %(producer)s::bigint, %(payload)s::bytea, %(ctype)s::text,
            %(prio)s::int, %(headers)s::jsonb, 102, now(), now(),
            %(type)s::text, now() + COALESCE(%(ttl)s::int, (SELECT message_ttl FROM broker_channel WHERE id = %(channel)s::bigint)) * interval '1 second',
            %(tp)s::text, %(ts)s::text)
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id, message_id, priority, channel_id, type, expires_at
), b AS MATERIALIZED (
    SELECT broker_payload_json(%(payload)s::bytea, %(ctype)s::text) AS body,
           broker_headers_lower(%(headers)s::jsonb) AS headers
     WHERE EXISTS (SELECT 1 FROM consumers_consumer k WHERE k.channel_id = %(channel)s::bigint AND k.filter_plan IS NOT NULL)
), k AS MATERIALIZED (
    -- the channel's consumers, each locked FOR KEY SHARE (what a foreign key's check did per job):
    -- consumer_delete locks its row first, so a consumer is either deleted after this commits (its
    -- jobs with it) or gone before the lock is granted (no job for it)
    SELECT * FROM consumers_consumer WHERE channel_id = %(channel)s::bigint FOR KEY SHARE
), jobs_created AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                          next_attempt_at, incremental_timeout, status_changed_at, created_at, expires_at)
    SELECT src.id, c.id, c.channel_id, 1001, src.priority, 0, now(), 0, now(), now(), src.expires_at
      FROM (SELECT m.*, b.body, b.headers FROM m LEFT JOIN b ON true) src
      JOIN k c ON c.channel_id = src.channel_id
     WHERE {{job_wanted}}

-- insert_messages --
-- index: message_unique_per_channel
-- hot
-- Messages and their fan-out in one statement (one message or a batch, in input order: job ids
-- follow message order). ``m``: the messages (an id already in the channel inserts nothing; one
-- repeated in the batch, its first occurrence). ``src``: each stored message with its input's
-- partition key and gate and, only when the channel has a filtered consumer (consumer_filtered: one
-- probe of an index of the filtered consumers only), its payload as jsonb and its headers by
-- lower-case name, computed once per message. ``jobs_created``: one QUEUED job per consumer of the
-- channel whose messageTypes and filter match (``broker_filter_match``, consumers migration 0011,
-- runs for filtered consumers only); a keyed job joins its consumer's partition of the key (upserted
-- before, in the same transaction) at the message's gate, by one probe of partition_unique_key per
-- job (LIMIT 1 keeps it a probe: never a join over every partition). Returns, on every row, the
-- consumers that got jobs: their wake-up is sent after the commit (broker.db.notify).
WITH t AS MATERIALIZED (
    SELECT * FROM unnest(%(mids)s::text[], %(payloads)s::bytea[], %(ctypes)s::text[], %(prios)s::int[],
                         %(headers)s::jsonb[], %(types)s::text[], %(ttls)s::int[], %(tps)s::text[],
                         %(tss)s::text[], %(pkeys)s::text[], %(gates)s::int[])
           WITH ORDINALITY AS t(mid, payload, ctype, prio, headers, type, ttl, tp, ts, pkey, gate, ord)
), m AS (
    INSERT INTO broker_message (channel_id, message_id, producer_id, payload, content_type, priority,
                                headers, status, received_at, dispatched_at, type, expires_at, traceparent, tracestate)
    SELECT %(channel)s::bigint, t.mid, %(producer)s::bigint, t.payload, t.ctype, t.prio, t.headers, 102, now(), now(),
           t.type, now() + COALESCE(t.ttl, (SELECT message_ttl FROM broker_channel WHERE id = %(channel)s::bigint)) * interval '1 second',
           t.tp, t.ts
      FROM t ORDER BY t.ord
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id, message_id, priority, channel_id, type, expires_at
), src AS MATERIALIZED (
    SELECT DISTINCT ON (m.id) m.id, m.priority, m.channel_id, m.type, m.expires_at, t.pkey, t.gate,
           CASE WHEN f.filtered THEN broker_payload_json(t.payload, t.ctype) END AS body,
           CASE WHEN f.filtered THEN broker_headers_lower(t.headers) END AS headers
      FROM m JOIN t ON t.mid = m.message_id
           CROSS JOIN (SELECT EXISTS (SELECT 1 FROM consumers_consumer k
                                       WHERE k.channel_id = %(channel)s::bigint AND k.filter_plan IS NOT NULL)
                              AS filtered) f
     ORDER BY m.id, t.ord
), k AS MATERIALIZED (
    -- the channel's consumers, locked as in insert_one (no foreign key checks each job)
    SELECT * FROM consumers_consumer WHERE channel_id = %(channel)s::bigint FOR KEY SHARE
), jobs_created AS (
    INSERT INTO jobs_job (message_id, consumer_id, channel_id, status, priority, retry_count,
                          next_attempt_at, incremental_timeout, status_changed_at, created_at,
                          expires_at, partition_id, gate)
    SELECT src.id, c.id, c.channel_id, 1001, src.priority, 0, now(), 0, now(), now(),
           src.expires_at, pt.id, CASE WHEN pt.id IS NULL THEN 0 ELSE src.gate END
      FROM src JOIN k c ON c.channel_id = src.channel_id
      LEFT JOIN LATERAL (SELECT p.id FROM jobs_partition p
                          WHERE src.pkey IS NOT NULL AND p.consumer_id = c.id AND p.key = src.pkey LIMIT 1) pt ON true
     WHERE {{job_wanted}}

-- scheduled_create --
-- index: scheduled_unique_per_channel
-- Store a message to publish later when it is far enough ahead (database clock) and its id is not
-- used in the channel by a message (message_unique_per_channel) or another scheduled one.
WITH chk AS (
    SELECT %(at)s >= now() + %(min_delay)s * interval '1 second' AS in_time,
           EXISTS (SELECT 1 FROM broker_message WHERE channel_id = %(channel)s AND message_id = %(mid)s) AS taken
), ins AS (
    INSERT INTO broker_scheduledmessage (channel_id, message_id, producer_id, payload, content_type, priority,
                                         headers, status, dispatch_at, created_at, error, type, ttl,
                                         traceparent, tracestate)
    SELECT %(channel)s, %(mid)s, %(producer)s, %(payload)s, %(ctype)s, %(prio)s, %(headers)s, %(scheduled)s,
           %(at)s, now(), '', %(type)s, %(ttl)s, %(tp)s, %(ts)s
      FROM chk WHERE in_time AND NOT taken
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING id
)
SELECT in_time, taken, (SELECT count(*) FROM ins) FROM chk;

-- scheduled_due --
-- index: scheduled_due
-- Due scheduled messages, oldest due first, locked SKIP LOCKED (several workers dispatch at once).
SELECT s.id, s.channel_id, ch.channel_id, s.producer_id, p.producer_id, s.message_id, s.payload,
       s.content_type, s.priority, s.headers, s.type, s.ttl, s.traceparent, s.tracestate
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

-- replay_chunk --
-- index: message_channel_received, job_unique_per_consumer, pk
-- One chunk of a replay (jobs.publish.replay): the next %(limit)s messages of the channel in the window,
-- walked by keyset on message_channel_received (channel_id, received_at, id); this consumer's job of
-- each message found through job_unique_per_consumer (message_id, consumer_id), then moved by
-- primary key. DELIVERED (unless only_failed) and DEAD jobs go back to QUEUED, retry count 0 (rows
-- locked SKIP LOCKED: a job some other statement holds right now is skipped, never waited for); a
-- message without a job of this consumer gets a fresh QUEUED job (unless only_failed), if the
-- consumer's messageTypes and filter match and it has not expired. QUEUED and INFLIGHT jobs are skipped, and
-- so are partitioned jobs and messages (a job put back below its partition's gate could never run
-- again). The moves' history is the trigger's (last_reason 'replay'); the trigger covers UPDATE and
-- DELETE only, so the new jobs' NULL -> QUEUED rows (reason 'replay') are written here. The messages
-- are held FOR KEY SHARE until the chunk commits: the retention sweep (retention_batch) skips a
-- message so held, and one it is removing right now is waited for and then left out, so no job is
-- ever added to a message on its way out (jobs_job has no foreign keys: these locks are what keeps
-- a job from pointing at a message or a consumer that is gone).
WITH m AS MATERIALIZED (
    -- a range on channel_id keeps it in the sort keys: only message_channel_received gives this order
    SELECT id, priority, received_at, type, expires_at FROM broker_message
     WHERE channel_id BETWEEN %(channel)s AND %(channel)s
       AND (received_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
       AND received_at <= %(until)s::timestamptz
     ORDER BY channel_id, received_at, id LIMIT %(limit)s
       FOR KEY SHARE
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
      FROM m src  -- the consumer locked FOR KEY SHARE, as at fan-out (no foreign key checks a job)
      JOIN (SELECT * FROM consumers_consumer WHERE id = %(consumer)s FOR KEY SHARE) c ON true LEFT JOIN LATERAL (
          SELECT 1 AS yes FROM jobs_job o WHERE o.message_id = src.id AND o.partition_id IS NOT NULL LIMIT 1) pt ON true
     WHERE NOT %(only_failed)s AND pt.yes IS NULL
       AND (src.expires_at IS NULL OR src.expires_at > now())
       AND (c.message_types IS NULL OR cardinality(c.message_types) = 0 OR EXISTS (
               SELECT 1 FROM unnest(c.message_types) p
                WHERE p = '*' OR CASE WHEN right(p, 2) = '.*'
                                      THEN src.type = left(p, -2) OR starts_with(src.type, left(p, -1))
                                      ELSE src.type = p END))  -- the consumer's messageTypes, as at fan-out
       AND CASE WHEN c.filter_plan IS NULL THEN true  -- and its filter, as at fan-out
                ELSE broker_filter_match(c.filter_plan,
                         (SELECT broker_payload_json(x.payload, x.content_type) FROM broker_message x WHERE x.id = src.id),
                         (SELECT broker_headers_lower(x.headers) FROM broker_message x WHERE x.id = src.id)) END
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

-- publish_refusals_add --
-- index: none (an append to the counter deltas, folded by counters_compact)
-- A web process's publishes refused at once (503 overloaded) since its last write, by reason
-- (scope 34: owner 0, status the reason code of jobs.publish.refusals).
INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
SELECT 34, 0, t.status, t.delta FROM unnest(%(statuses)s::int[], %(deltas)s::bigint[]) AS t(status, delta);
