"""The counter fold leaves an empty slot alone (no TRUNCATE when there is nothing to fold).

``broker_counterdelta_fold`` (migration 0023) emptied its slot by TRUNCATE every 5 s, rows or not: on
an idle broker, a new file for the partition every 5 s (created, synced, the old one unlinked, WAL
for both) and an invalidation of the plans that read it, for nothing. A busy broker folds as before.
(The idle broker's claims are still planned again at about 0.4 of their calls after this change:
pg_stat_statements in bench/capacity.py --idle --statements; that cause is elsewhere.)
"""

from django.db import migrations

FOLD = """
CREATE OR REPLACE FUNCTION broker_counterdelta_fold(p_slot smallint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    part text := 'broker_counterdelta_' || p_slot;
    folded bigint;
BEGIN
    PERFORM set_config('lock_timeout', '20ms', true);
    BEGIN
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', part);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', '0', true);
        RETURN -1;
    END;
    PERFORM set_config('lock_timeout', '0', true);
    EXECUTE format(
        'WITH s AS (SELECT scope, owner_id, status, sum(delta) AS n, count(*) AS rows FROM %I'
        '            GROUP BY scope, owner_id, status),'
        '     i AS (INSERT INTO broker_counter (scope, owner_id, status, count)'
        '           SELECT scope, owner_id, status, n FROM s ORDER BY scope, owner_id, status'
        '           ON CONFLICT (scope, owner_id, status) DO UPDATE SET count = broker_counter.count + EXCLUDED.count)'
        ' SELECT COALESCE(sum(rows), 0) FROM s', part) INTO folded;
    IF folded > 0 THEN
        EXECUTE format('TRUNCATE %I', part);
    END IF;
    RETURN folded;
END $$;
"""

PREVIOUS = FOLD.replace("""    IF folded > 0 THEN
        EXECUTE format('TRUNCATE %I', part);
    END IF;""", """    EXECUTE format('TRUNCATE %I', part);""")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0025_push_owners"),
    ]

    # safe: CREATE OR REPLACE of a function; the previous release's callers call it unchanged
    operations = [
        migrations.RunSQL(FOLD, PREVIOUS),
    ]
