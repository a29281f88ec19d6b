-- Named SQL of jobs.partitions (format: broker.db.queries): partition rows, settles, gate moves,
-- push leases.
-- Job statuses are literals (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003, DEAD 1004; partition
-- AVAILABLE 1) wherever a generic plan must use a partial index: only a literal lets a plan (a
-- cached generic plan above all) use the partial indexes that hold one status (job_claim,
-- job_inflight_deadline, ...). History rows are written by the jobs_job trigger (migration 0017)
-- from ``last_reason``, which every status-changing UPDATE sets.

-- partition_row --
-- index: pk|partition_unique_key
-- One partition with its consumer and channel ids, by primary key, or by (consumer, key) when
-- %(id)s is NULL (partition AVAILABLE 1, FAILED 2, COMPLETE 3). Run with its values: the branch
-- not taken folds away.
SELECT p.id, p.consumer_id, p.key, p.gate, p.status, p.version, p.closed, p.auto_close,
       p.manual_checkpoint, p.owner, p.lease_until, p.created_at, p.updated_at,
       c.consumer_id, ch.channel_id, p.lease_until > now(), p.completed_at
  FROM jobs_partition p
  JOIN consumers_consumer c ON c.id = p.consumer_id
  JOIN broker_channel ch ON ch.id = c.channel_id
 WHERE (%(id)s::bigint IS NOT NULL AND p.id = %(id)s::bigint)
    OR (%(id)s::bigint IS NULL AND p.consumer_id = %(consumer)s::bigint AND p.key = %(key)s::text);

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
-- none in flight (a job still in flight belongs to the worker that claimed it). Only the push
-- consumers' partitions are read (by consumer; partition_consumer_status once the table is big): as a join the planner
-- probed every partition, a pull consumer's 10,000 included, before filtering on the consumer's
-- type (5.6 s a cycle at 1M jobs, push delivery at 160/s).
SELECT p.id, p.version FROM jobs_partition p
 WHERE p.consumer_id = ANY(ARRAY(SELECT c.id FROM consumers_consumer c WHERE c.type = 'push' AND NOT c.paused))
   AND p.status = 1
   AND (p.owner = '' OR p.lease_until <= now())
   -- probes per partition (LIMIT 1 subqueries are never turned into joins: as NOT EXISTS a generic
   -- plan hashed every in-flight partitioned job first); ``status + 0`` in the in-flight probe:
   -- the partial index of in-flight jobs (job_inflight_consumer) looked smaller, but a probe there
   -- reads every in-flight job of the table
   AND (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate AND j.status = 1001
         LIMIT 1) IS NOT NULL
   AND (SELECT 1 FROM jobs_job j WHERE j.partition_id = p.id AND j.gate = p.gate AND j.status + 0 = 1002
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

-- push_claim_lock --
-- index: none (an advisory lock)
-- Serializes push claims database-wide for the rest of the transaction (key PUSH_CLAIM_LOCK):
-- each claim's fresh snapshot then sees every earlier one, so two dispatchers never fill one slot.
SELECT pg_advisory_xact_lock(%s);

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
SELECT id, partition_id, (SELECT count(*) FROM n), consumer_id FROM u;
