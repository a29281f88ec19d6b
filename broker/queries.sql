-- Named SQL of the broker app (format: broker.db.queries): the maintained counters.

-- counter_counts --
-- index: counter_key, counterdelta_owner
-- hot
-- The folded counts and the pending deltas of some (or all) owners of a scope, summed.
SELECT owner_id, status, sum(n)::bigint FROM (
    SELECT owner_id, status, count AS n FROM broker_counter
     WHERE scope = %(scope)s AND (%(ids)s::bigint[] IS NULL OR owner_id = ANY(%(ids)s::bigint[]))
    UNION ALL
    SELECT owner_id, status, delta FROM broker_counterdelta
     WHERE scope = %(scope)s AND (%(ids)s::bigint[] IS NULL OR owner_id = ANY(%(ids)s::bigint[]))
) x GROUP BY owner_id, status;

-- counters_compact_lock --
-- index: none (an advisory lock)
-- One compactor at a time, so two never deadlock on counter rows.
SELECT pg_try_advisory_xact_lock(hashtext('broker_counters_compact'));

-- counters_compact --
-- index: counter_key
-- Fold every pending delta into the counter rows (in key order: one lock order for every writer).
WITH d AS (DELETE FROM broker_counterdelta RETURNING scope, owner_id, status, delta),
s AS (SELECT scope, owner_id, status, sum(delta) AS n, count(*) AS rows FROM d
       GROUP BY scope, owner_id, status),
i AS (INSERT INTO broker_counter (scope, owner_id, status, count)
      SELECT scope, owner_id, status, n FROM s ORDER BY scope, owner_id, status
      ON CONFLICT (scope, owner_id, status) DO UPDATE SET count = broker_counter.count + EXCLUDED.count)
SELECT COALESCE(sum(rows), 0) FROM s;

-- counters_forget --
-- index: counter_key
-- Drop the folded counters of a deleted owner (consumer or channel).
DELETE FROM broker_counter WHERE scope = %s AND owner_id = %s;

-- counter_deltas_forget --
-- index: counterdelta_owner
-- Drop the pending deltas of a deleted owner.
DELETE FROM broker_counterdelta WHERE scope = %s AND owner_id = %s;
