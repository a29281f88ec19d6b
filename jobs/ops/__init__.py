"""What an operator does and sees: dead-job and backlog actions (``dead_jobs``), partition actions
(``partition_actions``), the dashboard's figures (``dashboard``, ``consumer_stats``), a consumer's attempts
for the delivery portal (``deliveries``), a job's own
payload for the admin (``payloads``) and the query-plan check (``plans``)."""
