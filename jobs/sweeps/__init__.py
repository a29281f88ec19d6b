"""The sweeps of the housekeeping routine, one file each: in-flight jobs past their deadline
(``inflight_timeout``), QUEUED jobs whose message expired (``message_expiry``) and finished messages
past their channel's retention (``retention``)."""
