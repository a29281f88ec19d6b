"""Delivery metrics for /metrics: push attempt outcomes by class, push attempt duration and delivery
latency histograms per consumer, maintained by statement-level triggers (see broker/delivery_metrics.py).

Why triggers into the counter deltas: /metrics must be right with several web processes and worker
clusters (so the numbers live in the database) and cheap to scrape (so they are maintained, never
aggregated from jobs_deliveryattempt at scrape time). One append-only insert per statement: the
push recorder writes a whole batch of attempts in one statement, so a batch costs one small insert;
concurrent writers never wait on each other (no row is updated; counters_compact folds the deltas).

Bucket index (bounds in ms, ascending b1..bN): the number of bounds below x, i.e. the first bucket
with x <= le (Prometheus buckets are inclusive); computed as N - width_bucket(-x, [-bN, ..., -b1]).
"""

from django.db import migrations

# Frozen copies of broker/delivery_metrics.py (a migration must not change when app code does;
# tests/hardening/test_metrics.py checks they agree).
DELIVERY = 4
ATTEMPT_BUCKET, ATTEMPT_SUM = 100, 199
LATENCY_BUCKET, LATENCY_SUM = 200, 299
ATTEMPT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


def bounds_sql(bounds: tuple) -> str:
    """Bounds in milliseconds, negated and reversed, for width_bucket."""
    return "ARRAY[" + ",".join(repr(-b * 1000.0) for b in reversed(bounds)) + "]::float8[]"

FORWARD = f"""
CREATE OR REPLACE FUNCTION jobs_attempt_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- grouped once by (consumer, class, bucket), then spread into the delta rows
    WITH g AS (
        SELECT j.consumer_id,
               CASE WHEN a.outcome = 'timeout' THEN 6
                    WHEN a.status_code BETWEEN 200 AND 299 THEN 1
                    WHEN a.status_code BETWEEN 300 AND 399 THEN 2
                    WHEN a.status_code BETWEEN 400 AND 499 THEN 3
                    WHEN a.status_code BETWEEN 500 AND 599 THEN 4
                    ELSE 5 END AS cls,
               width_bucket(-GREATEST(COALESCE(a.duration_ms, 0), 0)::float8, {bounds_sql(ATTEMPT_BOUNDS)}) AS b,
               count(*) AS n, sum(GREATEST(COALESCE(a.duration_ms, 0), 0)) AS ms
          FROM new_rows a JOIN jobs_job j ON j.id = a.job_id
         GROUP BY 1, 2, 3
    )
    INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
    SELECT {DELIVERY}, consumer_id, cls, sum(n) FROM g GROUP BY consumer_id, cls
    UNION ALL
    SELECT {DELIVERY}, consumer_id, {ATTEMPT_BUCKET + len(ATTEMPT_BOUNDS)} - b, sum(n) FROM g GROUP BY consumer_id, b
    UNION ALL
    SELECT {DELIVERY}, consumer_id, {ATTEMPT_SUM}, round(sum(ms) * 1000)::bigint FROM g GROUP BY consumer_id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_attempt_metrics AFTER INSERT ON jobs_deliveryattempt
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_attempt_metrics();

CREATE OR REPLACE FUNCTION jobs_latency_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- most job updates are claims and retries: nothing delivered, nothing to do
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE status = 1003) THEN
        RETURN NULL;
    END IF;
    -- (the status comparison spans both sides, so the planner hashes the join: 0.5 ms per
    -- 500-job ack instead of 20+ ms with a nested loop over the transition tables)
    WITH d AS (
        SELECT n.consumer_id, GREATEST(extract(epoch FROM now() - n.created_at) * 1000.0, 0)::float8 AS ms
          FROM new_rows n JOIN old_rows o ON o.id = n.id
         WHERE n.status = 1003 AND n.status <> o.status
    ), g AS (
        SELECT consumer_id, width_bucket(-ms, {bounds_sql(LATENCY_BOUNDS)}) AS b, count(*) AS n, sum(ms) AS ms
          FROM d GROUP BY 1, 2
    )
    INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
    SELECT {DELIVERY}, consumer_id, {LATENCY_BUCKET + len(LATENCY_BOUNDS)} - b, n FROM g
    UNION ALL
    SELECT {DELIVERY}, consumer_id, {LATENCY_SUM}, round(sum(ms) * 1000)::bigint FROM g GROUP BY consumer_id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_latency_metrics AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_latency_metrics();

-- A deleted consumer's metrics go with it (bounded rows: consumers x codes).
CREATE OR REPLACE FUNCTION consumers_forget_delivery_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM broker_counter WHERE scope = {DELIVERY} AND owner_id IN (SELECT id FROM old_rows);
    DELETE FROM broker_counterdelta WHERE scope = {DELIVERY} AND owner_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END $$;

CREATE TRIGGER consumers_forget_delivery_metrics AFTER DELETE ON consumers_consumer
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION consumers_forget_delivery_metrics();
"""

REVERSE = """
DROP TRIGGER IF EXISTS jobs_attempt_metrics ON jobs_deliveryattempt;
DROP TRIGGER IF EXISTS jobs_latency_metrics ON jobs_job;
DROP TRIGGER IF EXISTS consumers_forget_delivery_metrics ON consumers_consumer;
DROP FUNCTION IF EXISTS jobs_attempt_metrics();
DROP FUNCTION IF EXISTS jobs_latency_metrics();
DROP FUNCTION IF EXISTS consumers_forget_delivery_metrics();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0001_initial"),
        ("consumers", "0001_initial"),
        ("jobs", "0013_partitions"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
