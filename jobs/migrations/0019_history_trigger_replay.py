"""The history trigger's transition table gains DELIVERED -> QUEUED (kind ``replay``, jobs.publish.replay).

Redefines ``jobs_job_history`` (migration 0017) with the pairs of ``jobs.state.transitions.TRANSITIONS``
as of this migration; DEAD -> QUEUED (``replay``, as ``requeue``) and QUEUED -> DEAD (``expired``,
as ``mark_dead``) were already in it. Reversing restores 0017's function.
"""

from django.db import migrations

# jobs.state.transitions.TRANSITIONS as of this migration (QUEUED 1001, INFLIGHT 1002, DELIVERED 1003,
# DEAD 1004; GONE 0 for a deleted job)
FORWARD = """
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
                                         (1004, 1002), (1004, 1001), (1001, 1004), (1003, 1001))
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
"""

# migration 0017's function
REVERSE = """
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0018_merge_expiry_history_trigger"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, REVERSE),
    ]
