-- Named SQL of jobs.push (format: broker.db.queries): the push claim, the record of attempts, the
-- circuit breaker, the dispatcher's slots.
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

-- push_owner_register --
-- index: pk
-- A push dispatcher engine registers (or, reconnected, moves) its LISTEN connection's backend
-- (jobs.push.owners): run on that connection, so the row names the backend whose end means the
-- process is gone.
INSERT INTO jobs_pushowner (id, pid, backend_start, registered_at)
SELECT %(owner)s::bigint, a.pid, a.backend_start, now() FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT (id) DO UPDATE SET pid = EXCLUDED.pid, backend_start = EXCLUDED.backend_start;

-- push_claimable --
-- fragment
-- What each of claim_push's walks asks of a job (``j``) besides its walk's own index conditions:
-- due, not expired, and when it is in a partition, the partition open at the job's gate and leased
-- by this worker and, for an ordered consumer (``w.ordered``), no job of that gate before it queued
-- or in flight.
j.next_attempt_at <= now()
                  AND (j.expires_at IS NULL OR j.expires_at > now())  -- expiry
                  AND (j.partition_id IS NULL OR (
        (SELECT pt.gate FROM jobs_partition pt WHERE pt.id = j.partition_id
            AND pt.status = 1 AND pt.owner = %(worker)s::text AND pt.lease_until > now()) = j.gate
        AND NOT (w.ordered AND EXISTS (
            SELECT 1 FROM jobs_job o WHERE o.partition_id = j.partition_id AND o.gate = j.gate
               AND o.id <> j.id AND (o.status = 1002 OR (o.status = 1001 AND o.id < j.id))))))

-- push_owner_lag --
-- index: pk
-- A dispatcher engine's delivery lag (jobs.push.lag), at most twice a second while it is not zero,
-- in its record-and-claim transaction: what publishing's admission reads (jobs.publish.admission).
UPDATE jobs_pushowner SET lag = %(lag)s::float8, lag_at = now() WHERE id = %(owner)s::bigint;

-- claim_push --
-- index: job_push_fresh, job_push_retry
-- hot
-- Claim due QUEUED jobs across every push consumer within maxInFlight, the GCRA pacing of
-- maxDeliveriesPerSecond and the claiming loop's fair shares (jobs.push.claim.fair_caps);
-- partitioned jobs only of partitions %(worker)s holds a live lease on.
-- What is in flight comes from the maintained counters (status 1002: a row and the deltas of the
-- last seconds), not from a walk of the in-flight jobs, which a held snapshot makes as long as the
-- hold (issue 35). Each consumer's walks start at its floors (jobs.state.floors), passed as one
-- JSON list %(floors)s (one parameter type whatever the list holds, so one prepared statement):
-- consumer_id, level fp and id fi of its fresh jobs, time ft of its retries; a consumer not in it is
-- walked in full. ``w`` finds the first fresh job at or past
-- the floor and the first retry at or past the time (locked or not), the claim walks from those,
-- and the last rows return them as the next floors (with the id sequence's value, and the retry
-- floor less %(lag)s seconds).
-- Run after push_claim_lock in the dispatcher's transaction. Statuses inlined (generic plans).
-- Circuit breaker (jobs.push.circuit; circuit states CLOSED 0, OPEN 1, HALF_OPEN 2; ``cb`` is the
-- consumer's consumers_circuit row, by its primary key consumer_id, NULL while it never failed):
-- OPEN or HALF_OPEN leaves room for one probe once next_probe_at has passed; after ``failures``
-- consecutive failures (below the threshold) at most threshold - failures requests are out at
-- once; NULL (no cap) when the breaker is off or never failed. The job claimed for an OPEN
-- circuit is its probe (CTE probe: HALF_OPEN until recorded). Returns m.type (filters),
-- r.cb_dirty (the circuit was counting failures or open when claimed), the message's trace context,
-- the consumer's room (the dispatcher's window: jobs.push.dispatcher) and how long each job waited
-- once due (jobs.push.lag).
WITH k AS MATERIALIZED (
    SELECT c.id, c.updated_at,
           LEAST(c.max_in_flight, c.max_ack_pending, CASE WHEN c.circuit_breaker_failures > 0 THEN
                CASE WHEN cb.state IN (1, 2) THEN CASE WHEN cb.next_probe_at <= now() THEN 1 ELSE 0 END
                     WHEN cb.failures > 0 THEN GREATEST(c.circuit_breaker_failures - cb.failures, 1) END END)
             - COALESCE((SELECT sum(x.n) FROM (
                   SELECT count AS n FROM broker_counter WHERE scope = 1 AND owner_id = c.id AND status = 1002
                   UNION ALL
                   SELECT delta FROM broker_counterdelta WHERE scope = 1 AND owner_id = c.id AND status = 1002) x), 0)
             AS room,
           c.max_deliveries_per_second AS rate, c.ordered,
           COALESCE(c.connection_timeout, %(conn_timeout)s::float8) + 0.25 + %(rational)s::float8 AS ttl,
           GREATEST(extract(epoch FROM p.tat - now()), 0) AS lag,
           c.circuit_breaker_failures > 0 AND cb.state IN (1, 2) AS probing,
           c.circuit_breaker_probe_seconds AS probe, COALESCE(cb.failures > 0 OR cb.state <> 0, false) AS cb_dirty
      FROM consumers_consumer c
      LEFT JOIN jobs_pushpace p ON p.consumer_id = c.id
      LEFT JOIN consumers_circuit cb ON cb.consumer_id = c.id  -- circuit breaker (jobs.push.circuit)
     WHERE c.type = 'push' AND NOT c.paused  -- flow control: a paused consumer gets nothing
), r AS MATERIALIZED (
    -- room: maxInFlight minus what is in flight now (any process), capped by the GCRA pacing
    -- of maxDeliveriesPerSecond (bursts of rate/20, at least 1) and by the claiming loop's fair
    -- share of its callbacks (q.n: the consumers %(ids)s with a cap %(caps)s). LEAST skips NULLs:
    -- no pacing, no cap.
    SELECT id, updated_at, rate, ttl, lag, ordered, probing, probe, cb_dirty,
           LEAST(room, %(limit)s::int, q.n,
                 CASE WHEN rate > 0 THEN floor(GREATEST(1, ceil(rate / 20.0)) - COALESCE(lag, 0) * rate)::int END) AS room
      FROM k LEFT JOIN unnest(%(ids)s::int8[], %(caps)s::int[]) q(c, n) ON q.c=id
), f AS (
    SELECT * FROM jsonb_to_recordset(%(floors)s::jsonb) AS f(consumer_id bigint, fp int, fi bigint, ft timestamptz)
), w AS MATERIALIZED (
    SELECT r.id, r.room, r.ordered, fl.priority AS lp, fl.id AS li, rl.t AS lt,
           COALESCE(f.fp, 2147483647) AS fp
      FROM r LEFT JOIN f ON f.consumer_id = r.id
      LEFT JOIN LATERAL (
          SELECT x.priority, x.id FROM (
              (SELECT j.priority, j.id FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count = 0 AND j.priority > COALESCE(f.fp, 2147483647)
                ORDER BY j.priority DESC, j.id LIMIT 1)
              UNION ALL
              (SELECT j.priority, j.id FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count = 0 AND j.priority = COALESCE(f.fp, 2147483647) AND j.id >= COALESCE(f.fi, 0)
                ORDER BY j.priority DESC, j.id LIMIT 1)
              UNION ALL
              (SELECT j.priority, j.id FROM jobs_job j
                WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count = 0 AND j.priority < COALESCE(f.fp, 2147483647)
                ORDER BY j.priority DESC, j.id LIMIT 1)
          ) x ORDER BY x.priority DESC, x.id LIMIT 1) fl ON true
      LEFT JOIN LATERAL (
          SELECT j.next_attempt_at AS t FROM jobs_job j
           WHERE j.consumer_id = r.id AND j.status = 1001 AND j.retry_count > 0
             AND j.next_attempt_at >= COALESCE(f.ft, '-infinity'::timestamptz)
           ORDER BY j.next_attempt_at LIMIT 1) rl ON true
     WHERE r.room > 0
), cand AS MATERIALIZED (
    SELECT x.id, x.priority
      FROM w CROSS JOIN LATERAL (
          SELECT y.id, y.priority FROM (
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = w.id AND j.status = 1001 AND j.retry_count = 0
                  AND j.priority = w.lp AND j.id >= w.li
                  AND {{push_claimable}}
                ORDER BY j.priority DESC, j.id LIMIT w.room)
              UNION ALL
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = w.id AND j.status = 1001 AND j.retry_count = 0
                  AND j.priority < w.lp
                  AND {{push_claimable}}
                ORDER BY j.priority DESC, j.id LIMIT w.room)
              UNION ALL
              (SELECT j.id, j.priority FROM jobs_job j
                WHERE j.consumer_id = w.id AND j.status = 1001 AND j.retry_count > 0
                  AND j.next_attempt_at >= w.lt AND {{push_claimable}}
                ORDER BY j.next_attempt_at LIMIT w.room)
          ) y ORDER BY y.priority DESC, y.id LIMIT w.room
      ) x
     ORDER BY x.priority DESC, x.id
     LIMIT %(limit)s::int
), u AS (
    -- Lock and move by primary key (id = ANY(array)): the plan then never depends on the
    -- table's statistics (a cached generic plan built on a fresh table once scanned every
    -- queued job here).
    UPDATE jobs_job j SET status = 1002, status_changed_at = now(),
                          deadline = now() + r.ttl * interval '1 second', last_reason = %(reason)s::text,
                          receipt = nextval('jobs_job_receipt_seq'),  -- every claim's own (jobs.pull.ack)
                          claimed_by = %(owner)s::bigint  -- the claiming dispatcher (jobs.sweeps.orphans)
      FROM (SELECT p.id, p.consumer_id FROM jobs_job p
             WHERE p.id = ANY(ARRAY(SELECT id FROM cand)) AND p.status = 1001
               FOR UPDATE SKIP LOCKED) pick
      JOIN r ON r.id = pick.consumer_id
     WHERE j.id = pick.id
    RETURNING j.id, j.consumer_id, j.message_id, j.priority, j.retry_count, j.partition_id, j.gate, j.payload,
              j.next_attempt_at
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
(SELECT u.id, u.consumer_id, u.priority, u.retry_count, m.message_id, COALESCE(u.payload, m.payload),
        m.content_type, m.headers, r.updated_at,
        CASE WHEN u.partition_id IS NOT NULL
             THEN (SELECT pt.key FROM jobs_partition pt WHERE pt.id = u.partition_id) END, u.gate, m.type, r.cb_dirty,
        m.traceparent, m.tracestate,  -- trace context (broker.tracing)
        r.room,  -- the consumer's room this claim filled up to (all of it: the consumer is saturated)
        NULL::int, NULL::bigint, NULL::bigint, NULL::timestamptz,
        extract(epoch FROM now() - u.next_attempt_at)::float8  -- how long it waited, due (jobs.push.lag)
   FROM u JOIN broker_message m ON m.id = u.message_id JOIN r ON r.id = u.consumer_id
  ORDER BY u.priority DESC, u.id)
UNION ALL
-- last: each walked consumer's next floors (jobs.state.floors): the first live fresh job's level and
-- id, the id sequence, and the retry floor
SELECT NULL, w.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       w.lp, w.li, (SELECT last_value FROM jobs_job_id_seq),
       LEAST(w.lt, now() - %(lag)s::float8 * interval '1 second'), NULL::float8
  FROM w;

-- push_record --
-- index: pk
-- hot
-- Finished push attempts: each job still INFLIGHT moves (DELIVERED / QUEUED / DEAD), and every
-- attempt's row is written. Statuses inlined (generic plans).
-- Circuit breaker (jobs.push.circuit; circuit states CLOSED 0, OPEN 1, HALF_OPEN 2; consumers_circuit
-- read and written by primary key): a failed probe (its consumer's circuit is HALF_OPEN: the only
-- job in flight) goes back to QUEUED without spending a retry; each consumer's consecutive
-- failures add up (%(cb_ok)s: a success in the batch restarts the count) and reaching the threshold
-- opens the circuit once the failures have lasted circuit_breaker_open_after_seconds (issue 25: an
-- endpoint that still answers some calls is not cut off), counted from the start of the first
-- failed attempt (%(cb_since)s: a timed-out attempt was failing from its start). ``since`` moves
-- only when the circuit opens or closes, so the rows returned as changed are the advisories to raise.
-- Returns (partition to settle, NULL, NULL) rows and (NULL, consumer, new state) rows for circuits
-- that changed.
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
    -- circuit breaker: per consumer of the batch, whether an attempt succeeded, how many failed
    -- after the last success and how long ago the first of those started (a timeout has been
    -- failing since its attempt began, not since its outcome came back)
    SELECT * FROM unnest(%(cb_consumers)s::bigint[], %(cb_ok)s::bool[], %(cb_fails)s::int[], %(cb_since)s::float8[])
           AS x(consumer_id, ok, fails, since)
), cbu AS (
    -- the new failure count (nf), start of the run of failures (fs) and state (ns) are computed once
    -- per row, in a sub-SELECT of the SET that reads the row: an UPDATE re-evaluates it on the row as
    -- another dispatcher left it (a CTE would read a snapshot and lose concurrent counts). Opens only
    -- after ``circuit_breaker_failures`` consecutive failures that have gone on for
    -- ``circuit_breaker_open_after_seconds`` (no success since the run began); once open, failures
    -- keep it open.
    UPDATE consumers_circuit cb SET (failures, failing_since, state, since, next_probe_at) = (
        SELECT n.nf, n.fs, s.ns,
               CASE WHEN (s.ns = 0) <> (cb.state = 0) THEN now() ELSE cb.since END,
               CASE WHEN s.ns = 1 AND cb.state <> 1
                    THEN now() + k.circuit_breaker_probe_seconds * interval '1 second' ELSE cb.next_probe_at END
          FROM (SELECT CASE WHEN x.ok THEN x.fails ELSE cb.failures + x.fails END AS nf,
                       CASE WHEN x.ok THEN CASE WHEN x.fails > 0 THEN now() - x.since * interval '1 second' END
                            ELSE COALESCE(cb.failing_since, now() - x.since * interval '1 second') END AS fs) n
               CROSS JOIN LATERAL (
                   SELECT CASE WHEN k.circuit_breaker_failures > 0 AND n.nf >= k.circuit_breaker_failures
                                AND (cb.state <> 0
                                     OR n.fs <= now() - k.circuit_breaker_open_after_seconds * interval '1 second')
                               THEN 1 ELSE 0 END AS ns) s)
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE cb.consumer_id = x.consumer_id AND (x.fails > 0 OR cb.failures > 0 OR cb.state <> 0)
    RETURNING cb.consumer_id, cb.state, cb.since = now() AS changed
), cbi AS (
    -- the first failures of a consumer: open at once only when they began at least
    -- circuit_breaker_open_after_seconds ago (0: on the failures alone; timeouts: their attempts' start)
    INSERT INTO consumers_circuit (consumer_id, state, since, failures, next_probe_at, failing_since)
    SELECT x.consumer_id,
           CASE WHEN x.fails >= k.circuit_breaker_failures
                     AND k.circuit_breaker_open_after_seconds <= x.since THEN 1 ELSE 0 END,
           now(), x.fails, now() + k.circuit_breaker_probe_seconds * interval '1 second',
           now() - x.since * interval '1 second'
      FROM cbx x JOIN consumers_consumer k ON k.id = x.consumer_id
     WHERE x.fails > 0 AND k.circuit_breaker_failures > 0
       AND NOT EXISTS (SELECT 1 FROM consumers_circuit e WHERE e.consumer_id = x.consumer_id)
    ON CONFLICT (consumer_id) DO UPDATE SET failures = consumers_circuit.failures + EXCLUDED.failures,
                                            failing_since = COALESCE(consumers_circuit.failing_since,
                                                                     EXCLUDED.failing_since)
    RETURNING consumer_id, state
)
-- partitions to settle (jobs.partitions): nothing to return for non-partitioned jobs; circuits
-- that changed state (advisories)
SELECT DISTINCT partition_id, NULL::bigint, NULL::smallint FROM u WHERE partition_id IS NOT NULL AND status <> 1001
UNION ALL SELECT NULL, consumer_id, state FROM cbu WHERE changed
UNION ALL SELECT NULL, consumer_id, state FROM cbi WHERE state = 1;

-- push_transaction_setup --
-- index: none (settings only)
-- First in a push dispatcher's transaction: reuse the prepared generic plans, and no WAL flush
-- before going on (a crash may lose the last milliseconds of claims: at-least-once still holds).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('synchronous_commit', 'off', true);

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

-- circuit_consumers --
-- index: pk
-- The consumers whose circuit changed in a push record, with their circuit (jobs.push.circuit advisories).
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
    UPDATE consumers_circuit cb SET state = 0, failures = 0, since = now(), next_probe_at = NULL, failing_since = NULL
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

-- dispatcher_slot_lock --
-- index: none (an advisory lock)
-- A push dispatcher slot (cluster key, slot number): a session lock on the slot's dedicated
-- connection, so a worker killed with SIGKILL frees its slot with its connection.
SELECT pg_try_advisory_lock(hashtext(%s), %s);
