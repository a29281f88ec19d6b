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
