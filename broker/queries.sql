-- Named SQL of the broker app (format: broker.db.queries): the maintained counters.

-- counter_counts --
-- index: counter_key, counterdelta_owner
-- hot
-- The folded counts and the pending deltas of some owners of a scope (all of them when %(ids)s is
-- NULL), summed. Two small tables: a row per owner and status, and the deltas since the last
-- compaction (every few seconds).
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

-- counters_fold_slot --
-- index: counter_key
-- Fold the deltas of the slot not being written now (broker_counter_slot(), migration 0008) into
-- the counter rows and TRUNCATE it: no dead rows behind, even while a long reader holds an old
-- snapshot. -1 when the slot could not be locked at once (a long reader touched it): then
-- counters_compact folds by DELETE.
SELECT broker_counterdelta_fold((1 - broker_counter_slot())::smallint);

-- counters_compact --
-- index: counter_key
-- Fold every pending delta into the counter rows (in key order: one lock order for every writer):
-- the fallback of counters_fold_slot (its DELETE leaves dead rows until vacuumed).
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

-- db_now_ms --
-- index: none (no table)
-- The database clock to the millisecond: a new channel, producer or consumer row's updated_at, from
-- the same clock as the Last-Modified bumps of its later updates (broker.registry).
SELECT date_trunc('milliseconds', now());

-- db_ping --
-- index: none (no table)
-- Health: the database answers (/_status; a dispatcher slot's dedicated connection is alive).
SELECT 1;

-- counter_column_consumer_status --
-- index: counter_key, counterdelta_owner
-- A consumer's count of one status as a column of the admin's consumer list (folded count + pending
-- deltas), correlated to the outer consumers_consumer row: params scope, status, scope, status.
-- Not hot: one admin page (at most list_per_page consumers).
SELECT COALESCE(sum(n), 0) FROM (
    SELECT count AS n FROM broker_counter
     WHERE scope = %s AND owner_id = consumers_consumer.id AND status = %s
    UNION ALL
    SELECT delta FROM broker_counterdelta
     WHERE scope = %s AND owner_id = consumers_consumer.id AND status = %s
) c;

-- counter_column_channel --
-- index: counter_key, counterdelta_owner
-- A channel's count as a column of the admin's channel list, over every status (messages) or of one
-- (scheduled messages still SCHEDULED), correlated to the outer broker_channel row: params scope,
-- status, status, twice (status NULL: every status; Django binds the values into the text, so the
-- planner drops the test). Not hot (one admin page).
SELECT COALESCE(sum(n), 0) FROM (
    SELECT count AS n FROM broker_counter
     WHERE scope = %s AND owner_id = broker_channel.id AND (%s::int IS NULL OR status = %s)
    UNION ALL
    SELECT delta FROM broker_counterdelta
     WHERE scope = %s AND owner_id = broker_channel.id AND (%s::int IS NULL OR status = %s)
) c;

-- message_payload_head --
-- index: pk
-- The admin's payload preview of a message: at most %s bytes of it (a 5 MB payload is never
-- read whole), its size and content type. Params: limit, id.
SELECT substring(payload FROM 1 FOR %s), octet_length(payload), content_type FROM broker_message WHERE id = %s;

-- scheduled_payload_head --
-- index: pk
-- The admin's payload preview of a scheduled message (as message_payload_head).
SELECT substring(payload FROM 1 FOR %s), octet_length(payload), content_type
  FROM broker_scheduledmessage WHERE id = %s;

-- plan_cache_mode_set --
-- index: none (a session setting)
-- Every broker connection plans its prepared statements generically (broker.db.run.PLAN_CACHE_MODE
-- says why; tests/broker checks the two agree).
SET plan_cache_mode = force_generic_plan;

-- session_settings_set --
-- index: none (session settings)
-- A broker session's bounds, once per connection (settings.BROKER_DB_SESSION_SETTINGS: statement_timeout
-- and idle_in_transaction_session_timeout from BROKER_DB_TIMEOUT; docs/high-availability.md).
SELECT set_config(n, v, false) FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(n, v);

-- transaction_begin --
-- index: none (a transaction)
-- Open a transaction on a connection in autocommit, for psycopg's rollback() to drop the session's
-- prepared statements (broker.db.run.prepared_statements_drop, after a migration changed a result type).
BEGIN;

-- settings_local_set --
-- index: none (sets planner settings)
-- A statement's planner settings (its registry ``settings:`` line) for the rest of the transaction.
SELECT set_config(n, v, true) FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(n, v);

-- settings_local_reset --
-- index: none (resets planner settings)
-- Back to the session's values once the statement ran (set_config with NULL is a RESET).
SELECT set_config(n, NULL, true) FROM unnest(%(names)s::text[]) AS s(n);

-- settings_current --
-- index: none (settings only)
-- The session's current values of some settings, in the order named (broker.db.plans puts them
-- back after an EXPLAIN).
SELECT current_setting(n) FROM unnest(%(names)s::text[]) WITH ORDINALITY AS s(n, i) ORDER BY i;

-- settings_session_set --
-- index: none (settings only)
-- Some settings for the session (broker.db.plans: the plan cache mode and a statement's planner
-- settings while it is explained, then their old values).
SELECT set_config(n, v, false) FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(n, v);

-- db_now --
-- index: none (no table)
-- The database clock.
SELECT now();

-- advisory_lock_wait --
-- index: none (an advisory lock)
-- Wait for a session advisory lock (key text, number) until it is free or the session's
-- lock_timeout passes (SQLSTATE 55P03): a blocking wait on the server, no polling. A push
-- dispatcher slot's standby waits this way (jobs/tasks.py).
SELECT pg_advisory_lock(hashtext(%s), %s);

-- advisory_unlock --
-- index: none (an advisory lock)
-- Give back one session advisory lock (key text, number) this session holds.
SELECT pg_advisory_unlock(hashtext(%s), %s);

-- relation_sizes --
-- index: none (catalogs: pg_class, pg_stat_user_tables)
-- Rows (estimated: pg_class.reltuples, or the live tuples the statistics collector counts when the
-- table was never analyzed) and bytes (table, indexes and TOAST) of the named tables, for
-- ``manage.py broker_upgrade_check``.
SELECT c.relname, GREATEST(c.reltuples, COALESCE(s.n_live_tup, 0), 0)::bigint, pg_total_relation_size(c.oid)
  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid);

-- transactions_long --
-- index: none (pg_stat_activity)
-- Sessions whose transaction has been open longer than the given seconds: a migration's lock waits
-- behind them (and, with a lock_timeout, gives up and retries), so the operator ends or waits for
-- them first (``manage.py broker_upgrade_check``).
SELECT pid, COALESCE(application_name, ''), extract(epoch FROM now() - xact_start)::int, COALESCE(state, ''),
       left(regexp_replace(query, '\s+', ' ', 'g'), 120)
  FROM pg_stat_activity
 WHERE xact_start < now() - make_interval(secs => %s) AND pid <> pg_backend_pid()
 ORDER BY xact_start;

-- notify_session_setup --
-- index: none (no table)
-- The wake-up connection's commits (one NOTIFY each) need no WAL flush: a wake-up is not data, and a
-- lost one is covered by the listeners' polls (broker.db.notify).
SET synchronous_commit = off;

-- notify_send --
-- index: none (no table)
-- One wake-up: the channel and the comma-separated ids of the consumers that got jobs (broker.db.notify).
SELECT pg_notify(%s, %s);

-- task_due --
-- index: django_q_ormq's primary key only (the queue holds a handful of rows: hand-overs, schedules)
-- The cluster's task queue (broker.task_queue.OrmQueue): whether a task of queue %s can be taken
-- before %s (django-q2's own read of OrmQ, as one plain statement twice a second).
SELECT EXISTS (SELECT 1 FROM django_q_ormq WHERE key = %s AND lock < %s);
