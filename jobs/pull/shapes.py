"""The pull protocol's JSON shapes: a job as a puller sees it (``claimed_repr``), its message
(``message_repr``: UTF-8 text, or base64 with ``PayloadEncoding``), seconds. Pure functions of a
row, shared by the spec path and the batch pull, so both answer with the same shapes."""

from __future__ import annotations

import base64

from broker.times import rfc3339
from broker.tracing import TraceContext
from broker.xid import job_xid
from jobs.publish.messages import headers_decode
from jobs.pull.claim import ClaimedJob
from jobs.pull.fields import receipt_repr


def seconds_repr(value: float) -> float | int:
    """Whole seconds as integers (webhook-broker's uint), fractions kept."""
    return int(value) if float(value).is_integer() else value


def message_repr(message_id: str, payload: bytes, content_type: str, headers,
                 trace: TraceContext | None = None) -> dict:
    """The spec's Message; a payload that is not UTF-8 goes out as base64 with ``PayloadEncoding``.
    Its trace context (W3C) is in ``Headers`` as ``traceparent`` and ``tracestate``; a message an
    inbound source published names it in ``Source`` and the provider's delivery id in ``SourceDelivery``."""
    message = {"MessageID": message_id, "Payload": None, "ContentType": content_type,
               "Headers": dict(headers_decode(headers))}
    source = message["Headers"].get("X-Broker-Source")
    if source is not None:  # inbound sources: only a source's message carries it (sources migration 0002)
        message["Source"] = source
        message["SourceDelivery"] = message["Headers"].get("X-Broker-Source-Delivery")
    if trace is not None and trace.traceparent:
        message["Headers"]["traceparent"] = trace.traceparent
        if trace.tracestate:
            message["Headers"]["tracestate"] = trace.tracestate
    try:
        message["Payload"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        message["Payload"] = base64.b64encode(payload).decode()
        message["PayloadEncoding"] = "base64"
    return message


def claimed_repr(job: ClaimedJob) -> dict:
    body = {
        "ID": job_xid(job.id),
        "Priority": job.priority,
        "IncrementalTimeout": seconds_repr(job.incremental_timeout),
        "Attempt": job.retry_count + 1,
        "Deadline": rfc3339(job.deadline),
        "Message": message_repr(job.message_id, job.payload, job.content_type, job.headers, job.trace),
    }
    if job.message_type is not None:  # filters: the message's X-Broker-Message-Type
        body["Type"] = job.message_type
    if job.receipt is not None:  # this claim's receipt: an ack or progress carrying it is checked (jobs.pull.ack)
        body["Receipt"] = receipt_repr(job.receipt)
    if job.partition_key is not None:  # jobs.partitions: ack with NextState QUEUED + a higher Gate to move on
        body["PartitionKey"] = job.partition_key
        body["Gate"] = job.gate
    return body
