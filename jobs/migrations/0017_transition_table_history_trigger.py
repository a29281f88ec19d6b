"""One history writer and the transition table in the database (issue 16, item 3).

- ``jobs_job.last_reason``: the reason of a status change, set by the UPDATE that makes it.
- ``jobs_transition``: the (from_status, to_status) pairs of ``jobs.transitions.TRANSITIONS``,
  written out here (a migration must not change when the code does; a test checks that this table
  and the Python one are equal, so a new move needs a migration that adds its row).
- ``jobs_job_history``: a statement-level AFTER UPDATE / DELETE trigger on ``jobs_job``, the one
  writer of ``jobs_jobtransition``: one row per job whose status changed (reason: its
  ``last_reason``), and one per deleted job when the deleting statement set
  ``broker.history_reason`` (``set_config(..., true)``; the trigger clears it, so it covers that
  one statement; deletes without it, the prune and cascades, write none). A change that is not in
  ``jobs_transition`` raises SQLSTATE ``BRK01`` (mapped to ``IllegalTransition`` by
  ``broker.db.run``), so raw SQL cannot bypass the table either.
  Statement-level with transition tables like the counter triggers (migration 0002): one INSERT per
  statement whatever the batch size; the tuplestores are shared with those triggers.
"""

from django.db import migrations, models

FORWARD = """
CREATE TABLE jobs_transition (
    from_status smallint NOT NULL,
    to_status smallint NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
-- jobs.transitions.TRANSITIONS as of this migration (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003,
-- DEAD 1004, GONE 0)
INSERT INTO jobs_transition (from_status, to_status) VALUES
    (1001, 1002), (1002, 1003), (1002, 1001), (1002, 1004), (1004, 1002), (1004, 1001), (1001, 1004),
    (1001, 0), (1004, 0);

CREATE OR REPLACE FUNCTION jobs_job_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    why text;
    bad record;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        WITH moved AS (
            SELECT n.id, o.status AS from_s, n.status AS to_s, n.retry_count, n.last_reason
              FROM new_rows n JOIN old_rows o ON o.id = n.id
             WHERE n.status <> o.status
        ), h AS (
            INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
            SELECT id, from_s, to_s, retry_count, COALESCE(last_reason, ''), now() FROM moved ORDER BY id
        )
        SELECT m.from_s, m.to_s INTO bad FROM moved m
         WHERE NOT EXISTS (SELECT 1 FROM jobs_transition t WHERE t.from_status = m.from_s AND t.to_status = m.to_s)
         LIMIT 1;
    ELSE
        why := current_setting('broker.history_reason', true);
        IF why IS NULL OR why = '' THEN
            RETURN NULL;  -- a delete without a reason (prune, cascade): no history
        END IF;
        PERFORM set_config('broker.history_reason', '', true);
        WITH h AS (
            INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
            SELECT id, status, 0, retry_count, left(why, 32), now() FROM old_rows ORDER BY id
        )
        SELECT o.status AS from_s, 0 AS to_s INTO bad FROM old_rows o
         WHERE NOT EXISTS (SELECT 1 FROM jobs_transition t WHERE t.from_status = o.status AND t.to_status = 0)
         LIMIT 1;
    END IF;
    IF bad.from_s IS NOT NULL THEN
        RAISE EXCEPTION 'illegal job transition % -> %', bad.from_s, bad.to_s
            USING ERRCODE = 'BRK01', HINT = 'see jobs/transitions.py';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_job_history_upd AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_history();
CREATE TRIGGER jobs_job_history_del AFTER DELETE ON jobs_job
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_history();
"""

REVERSE = """
DROP TRIGGER IF EXISTS jobs_job_history_upd ON jobs_job;
DROP TRIGGER IF EXISTS jobs_job_history_del ON jobs_job;
DROP FUNCTION IF EXISTS jobs_job_history();
DROP TABLE IF EXISTS jobs_transition;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_inflight_by_consumer"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="last_reason",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
