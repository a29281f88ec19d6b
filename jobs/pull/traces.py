"""OpenTelemetry spans of the pull side (broker.tracing): one span per job of a pull claim and of an
ack, in the job's message's trace. Nothing runs unless OpenTelemetry is configured
(``settings.OTEL_TRACING``): no query, no span, no import of the SDK."""

from __future__ import annotations

import time

from django.conf import settings

from broker.db.run import query_fetchall
from broker.tracing import TraceContext, span_start
from jobs.pull.auth import PullContext
from jobs.pull.queries import Q
from jobs.state.transitions import STATUS_NAMES


def _attributes(ctx: PullContext, operation: str, message_id: str | None = None) -> dict:
    return {"messaging.system": "broker", "messaging.operation.type": operation,
            "messaging.destination.name": ctx.channel_id, "messaging.consumer.group.name": ctx.consumer_id,
            "messaging.message.id": message_id}


def claim_spans(*, ctx: PullContext, jobs: list, start_ns: int) -> None:
    """A span per claimed job ("pull claim", a child of the message's trace context); the job then
    carries the span's traceparent, so the consumer's own spans hang under the claim."""
    if not settings.OTEL_TRACING:
        return
    for job in jobs:
        span = span_start(f"pull claim {ctx.channel_id}", parent=job.trace, kind="consumer", start_ns=start_ns,
                          attributes={**_attributes(ctx, "receive", job.message_id), "broker.attempt": job.retry_count + 1})
        if span is not None:
            span.end()
            job.trace = TraceContext(span.traceparent, job.trace.tracestate if job.trace else "")


def ack_spans(*, ctx: PullContext, outcomes: dict[int, int | None], start_ns: int) -> None:
    """A span per acknowledged job ("pull ack", with the status it moved to), in its message's trace
    (read by job id: one query, only when tracing)."""
    if not settings.OTEL_TRACING or not outcomes:
        return
    for job_id, traceparent, tracestate in query_fetchall(Q.job_traces, {"ids": list(outcomes)}):
        span = span_start(f"pull ack {ctx.channel_id}", parent=TraceContext(traceparent or "", tracestate or ""),
                          kind="consumer", start_ns=start_ns, attributes=_attributes(ctx, "settle"))
        if span is not None:
            status = outcomes.get(job_id)
            span.end(**{"broker.outcome": STATUS_NAMES.get(status, "not moved") if status else "not moved"})


def now_ns() -> int:
    return time.time_ns()
