-- Named SQL of jobs.advisories (format: broker.db.queries): advisory rows.

-- advisory_insert --
-- index: none (an insert)
-- Record an advisory.
INSERT INTO consumers_advisory (type, channel_id, consumer_id, consumer_pk, "group", data, created_at)
VALUES (%s, %s, %s, %s, %s, %s::jsonb, now()) RETURNING id, created_at;
