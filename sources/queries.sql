-- Named SQL of sources (format: broker.db.queries): the lookup by id, the sources' producer, the
-- tallies and the pruning of expired dedupe rows. The dedupe itself is the trigger of migration 0002.

-- source_by_id --
-- index: sources_source_source_id_key
-- A source by its URL id with what receiving needs besides its own row: its channel's id and
-- token and the token of the producer sources publish as (one probe each). Read at most about once
-- a second per source and web process (sources.lookup), never per request.
SELECT s.id, s.source_id, s.name, s.channel_id, c.channel_id, c.token, p.token, s.verify, s.secret,
       s.previous_secret, extract(epoch FROM s.previous_expires_at), s.signature_header, s.algorithm,
       s.encoding, s.signature_prefix, s.api_key_header, s.dedupe, s.dedupe_window, s.message_type,
       s.response_status, s.response_body, s.response_content_type, s.enabled
  FROM sources_source s
  JOIN broker_channel c ON c.id = s.channel_id
  LEFT JOIN broker_producer p ON p.producer_id = %(producer)s::text
 WHERE s.source_id = %(id)s::text;

-- sources_producer_create --
-- index: broker_producer_producer_id_key
-- The broker-owned producer every source publishes as (created with the first source; concurrent
-- creations: one insert wins).
INSERT INTO broker_producer (producer_id, name, token, created_at, updated_at)
VALUES (%(producer)s::text, 'Inbound sources', %(token)s::text, now(), now())
ON CONFLICT (producer_id) DO NOTHING;

-- source_tallies_add --
-- index: none (an append to the counter deltas, folded by counters_compact)
-- A web process's counts of source requests by outcome since its last flush (scope 36: owner the
-- source, status the outcome code of sources.tallies).
INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
SELECT 36, t.owner, t.status, t.delta
  FROM unnest(%(owners)s::bigint[], %(statuses)s::int[], %(deltas)s::bigint[]) AS t(owner, status, delta);

-- source_refusals_add --
-- index: none (an insert)
-- The refusals a web process met since its last flush (the newest few per source).
INSERT INTO sources_sourcerefusal (source_id, at, reason, detail, remote)
SELECT t.source, to_timestamp(t.at), t.reason, t.detail, t.remote
  FROM unnest(%(sources)s::bigint[], %(ats)s::float8[], %(reasons)s::text[], %(details)s::text[],
              %(remotes)s::text[]) AS t(source, at, reason, detail, remote);

-- source_refusals_trim --
-- index: source_refusal_recent
-- Keep the newest %(kept)s refusals of each of these sources.
DELETE FROM sources_sourcerefusal r
 WHERE r.source_id = ANY(%(sources)s::bigint[])
   AND r.id < (SELECT x.id FROM sources_sourcerefusal x WHERE x.source_id = r.source_id
                ORDER BY x.id DESC OFFSET %(kept)s - 1 LIMIT 1);

-- source_refusals_recent --
-- index: source_refusal_recent
-- A source's last refusals, newest first.
SELECT at, reason, detail, remote FROM sources_sourcerefusal
 WHERE source_id = %(source)s::bigint ORDER BY id DESC LIMIT %(limit)s::int;

-- source_forget --
-- index: source_refusal_recent
-- What a deleted source leaves beside its row: its refusals (its counters go through
-- broker.counters.counters_forget; its dedupe rows expire and are pruned).
DELETE FROM sources_sourcerefusal WHERE source_id = %(source)s::bigint;

-- source_deliveries_prune --
-- index: source_delivery_expiry
-- One batch of expired dedupe rows (an expired row already counts as absent: the trigger renews it).
DELETE FROM sources_sourcedelivery
 WHERE ctid = ANY(ARRAY(SELECT ctid FROM sources_sourcedelivery WHERE expires_at <= now()
                         ORDER BY expires_at LIMIT %(batch)s::int));

-- source_refusals_orphans_prune --
-- index: source_refusal_recent
-- Refusals of sources deleted while a web process still held them unflushed.
DELETE FROM sources_sourcerefusal r WHERE NOT EXISTS (SELECT 1 FROM sources_source s WHERE s.id = r.source_id);
