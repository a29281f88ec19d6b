-- Named SQL of the eventtypes app (format: broker.db.queries): what each process reads to validate
-- publishes (eventtypes.validation). Writes go through the ORM; triggers move the generation.

-- event_types_generation --
-- index: pk
-- The number every change of the event types moves on (migration 0001's triggers): read by each
-- process at most twice a second, never per publish.
SELECT value FROM eventtypes_generation WHERE id = 1;

-- channel_event_types --
-- index: broker_channel_channel_id_key, eventtype_unique_per_channel, eventtypeversion_unique
-- A channel's validation rules in one round trip, with the generation of the same snapshot: whether
-- it is closed, each event type's current version and its schema (text: the process compiles it once
-- per event type and version). One row with a null mode: no such channel.
SELECT (SELECT g.value FROM eventtypes_generation g WHERE g.id = 1), c.event_types, t.id, t.name, t.version,
       v.schema::text
  FROM (VALUES (1)) AS one (n)
  LEFT JOIN broker_channel c ON c.channel_id = %s
  LEFT JOIN eventtypes_eventtype t ON t.channel_id = c.id
  LEFT JOIN eventtypes_eventtypeversion v ON v.event_type_id = t.id AND v.version = t.version;
