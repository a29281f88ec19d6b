"""The OpenAPI request schemas of the pull routes (issue 29 part 5): every field with the bounds its
parser enforces (``jobs.pull.claim.pull_request_parse``, ``jobs.pull.ack.ack_request_parse``,
``jobs.pull.fields``, ``jobs.pull.purge``, ``jobs.pull.groups``), so a request the schema allows is
one the route accepts. What depends on the consumer or the job is not the request's shape and is
answered as documented: a priority field on a consumer without that policy (400), a transition the
job's state does not allow (400 ``invalid_transition``, as webhook-broker), a stale claim (409).

The bodies' keys are read case-insensitively; the schemas name each once, exactly, and allow no
other (two spellings of one key in a body would be the same field twice).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter

from consumers.priority import GROUP_NAME
from jobs.publish.messages import GATE_MAX
from jobs.pull.ack import ACK_MAX, ACK_STATES
from jobs.pull.claim import PULL_BATCH_MAX, PULL_EXPIRES_MAX
from jobs.pull.fields import QUEUED_JOBS_DEFAULT, QUEUED_JOBS_MAX, TIMEOUT_MAX
from jobs.pull.spec import SPEC_STATES

SECONDS = {"type": "number", "minimum": 0, "maximum": TIMEOUT_MAX}
GATE = {"type": "integer", "minimum": 0, "maximum": GATE_MAX,
        "description": "partitions: the gate (above the job's) the in-flight job moves to"}
PAYLOAD = {"description": "with a Gate: the job's new payload (a string as its UTF-8 bytes, anything else as "
                          "JSON); absent: unchanged"}
RECEIPT = {"type": "string", "description": "the receipt the job was claimed with (X-Broker-Receipt, or the "
                                            "Receipt of a pulled job): settles only that claim"}
GROUP = {"type": "string", "pattern": GROUP_NAME.pattern, "description": "a priority group of the consumer"}
JOB_ID = {"type": "string", "description": "a job ID (xid); one that names no job of this consumer is answered "
                                           "per job (not_found)"}
_INT62 = 2**62


def _object(properties: dict, required: tuple = ()) -> dict:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


PULL_REQUEST = _object({
    "batch": {"type": "integer", "minimum": 1, "maximum": PULL_BATCH_MAX, "default": 1},
    "expires": {"type": "number", "minimum": 0, "maximum": PULL_EXPIRES_MAX, "default": 0,
                "description": "seconds to wait for jobs"},
    "no_wait": {"type": "boolean", "description": "never wait"},
    "max_bytes": {"type": "integer", "minimum": 1, "maximum": _INT62,
                  "description": "payload budget of the batch (at least one job)"},
    "IncrementalTimeout": SECONDS,
    "group": {**GROUP, "description": "priority groups: required on a consumer with a priorityPolicy, one of its "
                                      "groups (400 group_missing / invalid_group otherwise)"},
    "min_pending": {"type": "integer", "minimum": 0, "maximum": _INT62,
                    "description": "overflow consumers only (400 not_overflow_consumer)"},
    "min_ack_pending": {"type": "integer", "minimum": 0, "maximum": _INT62,
                        "description": "overflow consumers only (400 not_overflow_consumer)"},
    "id": {"type": "string", "maxLength": 64,
           "description": "the pin id the broker sent; pinned_client consumers only (400 not_pinned_consumer)"},
    "priority": {"type": "integer", "minimum": 0, "maximum": 9, "default": 0},
})

_SETTLE = sorted(set(ACK_STATES) - {"QUEUED"})  # DELIVERED, DEAD
ACK_ITEM = {"anyOf": [
    _object({"ID": JOB_ID, "NextState": {"type": "string", "enum": _SETTLE}, "Receipt": RECEIPT},
            ("ID", "NextState")),
    _object({"ID": JOB_ID, "NextState": {"type": "string", "enum": ["QUEUED"]},
             "Delay": {**SECONDS, "description": "negative acknowledgement: redelivered after this many seconds"},
             "Receipt": RECEIPT}, ("ID", "NextState")),
    _object({"ID": JOB_ID, "NextState": {"type": "string", "enum": ["QUEUED"]}, "Gate": GATE, "Payload": PAYLOAD,
             "Receipt": RECEIPT}, ("ID", "NextState", "Gate")),
]}
ACK_REQUEST = _object({"Jobs": {"type": "array", "items": ACK_ITEM, "minItems": 1, "maxItems": ACK_MAX,
                                "description": "each job once (400 duplicate_job)"}}, ("Jobs",))

_CLAIM = "INFLIGHT"
JOB_STATE_REQUEST = {"anyOf": [
    _object({"NextState": {"type": "string", "enum": [_CLAIM]},
             "IncrementalTimeout": {**SECONDS, "description": "only from QUEUED or DEAD (400 timeout_invalid_state)"}},
            ("NextState",)),
    _object({"NextState": {"type": "string", "enum": sorted(set(SPEC_STATES) - {_CLAIM})}}, ("NextState",)),
    _object({"NextState": {"type": "string", "enum": ["QUEUED"]}, "Gate": GATE, "Payload": PAYLOAD},
            ("NextState", "Gate")),
]}

PROGRESS_REQUEST = _object({"IncrementalTimeout": {**SECONDS, "description": "default: the job's stored one"},
                            "Receipt": RECEIPT})
UNPIN_REQUEST = _object({"group": GROUP}, ("group",))


def limit_param(default: int, maximum: int) -> OpenApiParameter:
    """``limit`` as ``jobs.pull.fields.limit_parse`` reads it: a non-negative integer (400 otherwise),
    larger values clipped to ``maximum``."""
    return OpenApiParameter("limit", {"type": "integer", "minimum": 0, "maximum": maximum, "default": default},
                            description=f"default {default}; larger values are clipped to {maximum}")


QUEUED_JOBS_LIMIT = limit_param(QUEUED_JOBS_DEFAULT, QUEUED_JOBS_MAX)
ADVISORIES_DEFAULT, ADVISORIES_MAX = 100, 1000  # GET .../advisories (web.api.pull.views.AdvisoriesView)
ADVISORIES_LIMIT = limit_param(ADVISORIES_DEFAULT, ADVISORIES_MAX)
# jobs.pull.purge.older_than_parse: an RFC 3339 time, or an age in seconds (below 1e10)
OLDER_THAN = OpenApiParameter(
    "olderThan", {"anyOf": [{"type": "string", "format": "date-time"},
                            {"type": "number", "minimum": 0, "exclusiveMaximum": 1e10}]},
    description="only jobs created before this RFC 3339 time, or more than this many seconds ago")
