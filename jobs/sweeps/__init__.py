"""The sweeps of the housekeeping routine, one file each: in-flight jobs past their deadline
(``inflight_timeout``) and QUEUED jobs whose message expired (``message_expiry``)."""
