"""The head of a job's own payload (set by a handler-driven gate move), for the admin's preview
(see ``broker.payloads``).
"""

from __future__ import annotations

from broker.payloads import PayloadHead, payload_head_read
from jobs.ops.queries import Q


def job_payload_head(*, pk: int, limit: int) -> PayloadHead:
    """None when the job has no payload of its own (its message's is delivered)."""
    return payload_head_read(Q.job_payload_head, pk=pk, limit=limit)
