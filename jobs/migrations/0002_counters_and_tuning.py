"""Counter triggers and autovacuum tuning for the hot job table.

Statement-level triggers with transition tables append one signed delta row per (owner, status)
per statement to broker_counterdelta, so a batch of 1,000 job updates costs one small insert,
and readers never run COUNT(*) over the job table. Status 2001 counts QUEUED/INFLIGHT jobs that
are being redelivered (retry_count > 0): the pull statistics' NumRedelivered.
"""

from django.db import migrations

JOB_DELTA = """
CREATE OR REPLACE FUNCTION jobs_job_count_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 1, consumer_id, s, sum(d) FROM (
            SELECT consumer_id, status AS s, 1 AS d FROM new_rows
            UNION ALL
            SELECT consumer_id, 2001, 1 FROM new_rows WHERE status IN (1001, 1002) AND retry_count > 0
        ) x GROUP BY consumer_id, s;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 1, consumer_id, s, sum(d) FROM (
            SELECT consumer_id, status AS s, -1 AS d FROM old_rows
            UNION ALL
            SELECT consumer_id, 2001, -1 FROM old_rows WHERE status IN (1001, 1002) AND retry_count > 0
        ) x GROUP BY consumer_id, s;
    ELSE
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 1, consumer_id, s, sum(d) FROM (
            SELECT consumer_id, status AS s, 1 AS d FROM new_rows
            UNION ALL
            SELECT consumer_id, 2001, 1 FROM new_rows WHERE status IN (1001, 1002) AND retry_count > 0
            UNION ALL
            SELECT consumer_id, status, -1 FROM old_rows
            UNION ALL
            SELECT consumer_id, 2001, -1 FROM old_rows WHERE status IN (1001, 1002) AND retry_count > 0
        ) x GROUP BY consumer_id, s HAVING sum(d) <> 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_job_count_ins AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_count_delta();
CREATE TRIGGER jobs_job_count_upd AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_count_delta();
CREATE TRIGGER jobs_job_count_del AFTER DELETE ON jobs_job
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_count_delta();

CREATE OR REPLACE FUNCTION broker_message_count_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 2, channel_id, status, count(*) FROM new_rows GROUP BY channel_id, status;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 2, channel_id, status, -count(*) FROM old_rows GROUP BY channel_id, status;
    ELSE
        INSERT INTO broker_counterdelta (scope, owner_id, status, delta)
        SELECT 2, channel_id, s, sum(d) FROM (
            SELECT channel_id, status AS s, 1 AS d FROM new_rows
            UNION ALL SELECT channel_id, status, -1 FROM old_rows
        ) x GROUP BY channel_id, s HAVING sum(d) <> 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER broker_message_count_ins AFTER INSERT ON broker_message
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_delta();
CREATE TRIGGER broker_message_count_upd AFTER UPDATE ON broker_message
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_delta();
CREATE TRIGGER broker_message_count_del AFTER DELETE ON broker_message
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_delta();

-- Finished jobs leave dead tuples at the head of the claim index; vacuum the hot table early.
ALTER TABLE jobs_job SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
                          autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.02,
                          fillfactor = 85);
ALTER TABLE broker_counterdelta SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                                     autovacuum_vacuum_cost_delay = 0);
"""

REVERSE = """
DROP TRIGGER IF EXISTS jobs_job_count_ins ON jobs_job;
DROP TRIGGER IF EXISTS jobs_job_count_upd ON jobs_job;
DROP TRIGGER IF EXISTS jobs_job_count_del ON jobs_job;
DROP FUNCTION IF EXISTS jobs_job_count_delta();
DROP TRIGGER IF EXISTS broker_message_count_ins ON broker_message;
DROP TRIGGER IF EXISTS broker_message_count_upd ON broker_message;
DROP TRIGGER IF EXISTS broker_message_count_del ON broker_message;
DROP FUNCTION IF EXISTS broker_message_count_delta();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0001_initial"),
        ("jobs", "0001_initial"),
    ]

    operations = [migrations.RunSQL(JOB_DELTA, REVERSE)]
