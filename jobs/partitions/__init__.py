"""Partitions with gates: ordered fan-out / fan-in per consumer, push leases, work stealing.

A message published with ``X-Broker-Partition-Key`` (and ``X-Broker-Gate``, default 0) gives each
consumer of its channel a job in that consumer's partition of the key, at that gate. Only jobs at
the partition's current gate are claimable (the claims in ``jobs/pull/queries.sql`` and
``jobs/push/queries.sql``); when every job there is DELIVERED the partition advances to the next
gate that has jobs (``settle``). A DEAD job at the current gate marks the partition FAILED until
it is requeued (resumes) or skipped (``jobs.ops.partition_actions``).

Every write of a partition row is optimistic: ``UPDATE ... WHERE id = %s AND version = %s`` with
``version = version + 1``; a lost race re-reads and retries (bounded), never overwrites.

Modules: ``rows`` (read a partition, its counts and JSON shape; create partitions at publish),
``settle`` (advance or fail a partition after its jobs moved; the hook every status writer
calls), ``gates`` (a handler-driven move of a job to a higher gate), ``leases`` (push workers'
leases and work stealing)."""
