"""Content filters (issue 25): Consumer.filter and its plan, the SQL functions the fan-out statements
call (``broker_filter_match`` over the plan, ``broker_payload_json``, ``broker_headers_lower``) and the
trigger that compiles the plan; the circuit breaker's ``circuitBreakerOpenAfterSeconds`` and
``failing_since``.

Why a plan: walking the filter object needs a query per node in PL/pgSQL (``jsonb_each``), about
8 us per consumer and message measured; the plan is arrays only, walked by index with expressions
(about 1 us), and is compiled once per consumer write by the trigger, never per message.
"""

from django.db import migrations, models


FUNCTIONS = r"""
-- A filter's conditions of one scope ('b' body, 'h' headers) as a flat list of nodes:
-- [scope, key, operator, argument] (key: the body path as a text[] literal, the header name in
-- lower case; a literal value is $eq) and ["or", [list, list, ...]]; $and lists are flattened.
CREATE OR REPLACE FUNCTION broker_filter_compile_conds(c jsonb, scope text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    k text; v jsonb; item jsonb; op text; arg jsonb; name text;
    plan jsonb := '[]'; alts jsonb;
BEGIN
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(c) e LOOP
        IF k = '$and' THEN
            FOR item IN SELECT a.value FROM jsonb_array_elements(v) a LOOP
                plan := plan || broker_filter_compile_conds(item, scope);
            END LOOP;
        ELSIF k = '$or' THEN
            alts := '[]';
            FOR item IN SELECT a.value FROM jsonb_array_elements(v) a LOOP
                alts := alts || jsonb_build_array(broker_filter_compile_conds(item, scope));
            END LOOP;
            plan := plan || jsonb_build_array(jsonb_build_array('or', alts));
        ELSE
            name := CASE WHEN scope = 'b' THEN string_to_array(k, '.')::text ELSE lower(k) END;
            IF jsonb_typeof(v) = 'object' THEN
                FOR op, arg IN SELECT e.key, e.value FROM jsonb_each(v) e LOOP
                    plan := plan || jsonb_build_array(jsonb_build_array(scope, name, op, arg));
                END LOOP;
            ELSE
                plan := plan || jsonb_build_array(jsonb_build_array(scope, name, '$eq', v));
            END IF;
        END IF;
    END LOOP;
    RETURN plan;
END $$;

-- A whole filter ({"body", "headers", "$or", "$and"}) as a plan: a list of nodes that must all hold.
CREATE OR REPLACE FUNCTION broker_filter_compile(f jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    k text; v jsonb; item jsonb; plan jsonb := '[]'; alts jsonb;
BEGIN
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(f) e LOOP
        IF k = 'body' THEN
            plan := plan || broker_filter_compile_conds(v, 'b');
        ELSIF k = 'headers' THEN
            plan := plan || broker_filter_compile_conds(v, 'h');
        ELSIF k = '$and' THEN
            FOR item IN SELECT a.value FROM jsonb_array_elements(v) a LOOP
                plan := plan || broker_filter_compile(item);
            END LOOP;
        ELSIF k = '$or' THEN
            alts := '[]';
            FOR item IN SELECT a.value FROM jsonb_array_elements(v) a LOOP
                alts := alts || jsonb_build_array(broker_filter_compile(item));
            END LOOP;
            plan := plan || jsonb_build_array(jsonb_build_array('or', alts));
        END IF;
    END LOOP;
    RETURN plan;
END $$;

-- Does a message match a consumer's filter plan? ``body``: the payload as jsonb (NULL when it is
-- not JSON: then no body condition holds); ``headers``: the stored metadata headers with lower-case
-- names (broker_headers_lower). Arrays walked by index, no query per node. The semantics are
-- consumers.filters.filter_matches (tests/consumers compare the two).
CREATE OR REPLACE FUNCTION broker_filter_match(plan jsonb, body jsonb, headers jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    i int; j int; n jsonb; op text; actual jsonb; arg jsonb; hit boolean;
BEGIN
    FOR i IN 0 .. jsonb_array_length(plan) - 1 LOOP
        n := plan -> i;
        IF n ->> 0 = 'or' THEN
            hit := false;
            FOR j IN 0 .. jsonb_array_length(n -> 1) - 1 LOOP
                IF broker_filter_match(n -> 1 -> j, body, headers) THEN
                    hit := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT hit THEN
                RETURN false;
            END IF;
            CONTINUE;
        END IF;
        IF n ->> 0 = 'b' THEN
            IF body IS NULL THEN
                RETURN false;  -- a body condition never matches a payload that is not JSON
            END IF;
            actual := body #> (n ->> 1)::text[];
        ELSE
            actual := headers -> (n ->> 1);
        END IF;
        op := n ->> 2;
        arg := n -> 3;
        IF op = '$eq' THEN
            hit := actual = arg;
        ELSIF op = '$ne' THEN
            hit := actual IS NULL OR actual <> arg;
        ELSIF op = '$in' OR op = '$nin' THEN
            IF actual IS NULL THEN
                hit := false;
            ELSIF jsonb_typeof(actual) IN ('object', 'array') THEN
                hit := false;
                FOR j IN 0 .. jsonb_array_length(arg) - 1 LOOP
                    IF arg -> j = actual THEN
                        hit := true;
                        EXIT;
                    END IF;
                END LOOP;
            ELSE
                hit := arg @> jsonb_build_array(actual);  -- a scalar: containment is equality
            END IF;
            IF op = '$nin' THEN
                hit := NOT hit;
            END IF;
        ELSIF op = '$exists' THEN
            hit := (actual IS NOT NULL) = (arg = 'true'::jsonb);
        ELSIF op = '$startsWith' THEN
            hit := jsonb_typeof(actual) = 'string' AND starts_with(actual #>> '{}', arg #>> '{}');
        ELSIF jsonb_typeof(actual) = 'number' AND jsonb_typeof(arg) = 'number' THEN
            hit := CASE op WHEN '$gt' THEN actual::numeric > arg::numeric
                           WHEN '$gte' THEN actual::numeric >= arg::numeric
                           WHEN '$lt' THEN actual::numeric < arg::numeric
                           WHEN '$lte' THEN actual::numeric <= arg::numeric END;
        ELSIF jsonb_typeof(actual) = 'string' AND jsonb_typeof(arg) = 'string' THEN
            -- byte order (collation C), whatever the database's collation
            hit := CASE op WHEN '$gt' THEN (actual #>> '{}') COLLATE "C" > (arg #>> '{}') COLLATE "C"
                           WHEN '$gte' THEN (actual #>> '{}') COLLATE "C" >= (arg #>> '{}') COLLATE "C"
                           WHEN '$lt' THEN (actual #>> '{}') COLLATE "C" < (arg #>> '{}') COLLATE "C"
                           WHEN '$lte' THEN (actual #>> '{}') COLLATE "C" <= (arg #>> '{}') COLLATE "C" END;
        ELSE
            hit := false;  -- an ordering across types, or of a missing value
        END IF;
        IF hit IS NOT TRUE THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END $$;

-- A payload as jsonb when its content type is JSON (application/json, application/*+json) and it
-- parses; NULL otherwise. Never an error: invalid UTF-8 or JSON, a NUL escape jsonb cannot hold, or
-- nesting too deep for the parser all read as "not JSON", so a payload can never fail a publish.
CREATE OR REPLACE FUNCTION broker_payload_json(payload bytea, content_type text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF content_type IS NULL
       OR lower(split_part(content_type, ';', 1)) !~ '^\s*application/([a-z0-9!#$&^_.+-]+\+)?json\s*$' THEN
        RETURN NULL;
    END IF;
    RETURN convert_from(payload, 'UTF8')::jsonb;
EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
    RETURN NULL;
END $$;

-- Stored metadata headers with lower-case names (header names are case-insensitive).
CREATE OR REPLACE FUNCTION broker_headers_lower(h jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(jsonb_object_agg(lower(e.key), e.value), '{}'::jsonb)
      FROM jsonb_each(CASE WHEN jsonb_typeof(h) = 'object' THEN h END) e
$$;

-- The plan follows the filter on every write of it, whoever writes (API, admin, seed).
CREATE OR REPLACE FUNCTION consumers_consumer_filter_plan() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.filter_plan := CASE WHEN jsonb_typeof(NEW.filter) = 'object' AND NEW.filter <> '{}'::jsonb
                            THEN broker_filter_compile(NEW.filter) END;
    RETURN NEW;
END $$;

CREATE TRIGGER consumer_filter_plan BEFORE INSERT OR UPDATE OF filter, filter_plan ON consumers_consumer
    FOR EACH ROW EXECUTE FUNCTION consumers_consumer_filter_plan();
"""

DROP = r"""
DROP TRIGGER IF EXISTS consumer_filter_plan ON consumers_consumer;
DROP FUNCTION IF EXISTS consumers_consumer_filter_plan();
DROP FUNCTION IF EXISTS broker_headers_lower(jsonb);
DROP FUNCTION IF EXISTS broker_payload_json(bytea, text);
DROP FUNCTION IF EXISTS broker_filter_match(jsonb, jsonb, jsonb);
DROP FUNCTION IF EXISTS broker_filter_compile(jsonb);
DROP FUNCTION IF EXISTS broker_filter_compile_conds(jsonb, text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0010_merge_message_types_circuit'),
    ]

    operations = [
        migrations.AddField(
            model_name='circuit',
            name='failing_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='consumer',
            name='circuit_breaker_open_after_seconds',
            field=models.FloatField(db_default=10.0, default=10.0),
        ),
        migrations.AddField(
            model_name='consumer',
            name='filter',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='consumer',
            name='filter_plan',
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name='consumer',
            index=models.Index(condition=models.Q(('filter_plan__isnull', False)), fields=['channel'], name='consumer_filtered'),
        ),
        migrations.RunSQL(FUNCTIONS, reverse_sql=DROP),
    ]
