"""What a job's page shows below its fields, for the operator's job page (``web.admin.jobs``) and
the delivery portal's: its delivery attempts, its state changes, its message's headers and the
payload it is delivered with. Each reads a bounded number of rows by a ``job_id`` index or a
primary key."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from broker.models import Message
from jobs.models import DeliveryAttempt, JobTransition
from jobs.state.transitions import STATUS_NAMES
from web.admin.helpers import json_block, payload_preview, table

DETAIL_ROWS = 200  # attempts / state changes listed on a job's page


def attempts_table(job_pk: int) -> SafeString:
    """The job's latest DETAIL_ROWS delivery attempts, oldest first."""
    rows = list(DeliveryAttempt.objects.filter(job_id=job_pk).order_by("-id")[:DETAIL_ROWS + 1])
    more = len(rows) > DETAIL_ROWS
    rows = rows[:DETAIL_ROWS]
    body = table(
        ["#", "started", "status code", "duration", "outcome", "response excerpt", "error"],
        [[a.attempt, a.started_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], a.status_code,
          "" if a.duration_ms is None else f"{a.duration_ms:,.1f} ms", a.outcome,
          Truncator(a.response_excerpt).chars(300), Truncator(a.error).chars(300)] for a in reversed(rows)],
        empty="No delivery attempts recorded (pull consumers report outcomes without attempts).")
    if more:
        return format_html("{}<p class='help'>Showing the latest {} attempts.</p>", body, DETAIL_ROWS)
    return body


def history_table(job_pk: int) -> SafeString:
    """The job's latest DETAIL_ROWS state changes, oldest first."""
    rows = list(JobTransition.objects.filter(job_id=job_pk).order_by("-at", "-id")[:DETAIL_ROWS])
    return table(["at", "from", "to", "retries", "reason"],
                 [[t.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                   STATUS_NAMES.get(t.from_status, "(created)") if t.from_status else "(created)",
                   STATUS_NAMES.get(t.to_status, t.to_status), t.retry_count, t.reason]
                  for t in reversed(rows)],
                 empty="No state changes recorded.")


def message_headers(message_pk: int) -> SafeString:
    return json_block(Message.objects.filter(pk=message_pk).values_list("headers", flat=True).first())


def job_payload(*, job_pk: int, message_pk: int, own: bool) -> SafeString:
    """What the job delivers: its own payload when a handler-driven gate move gave it one (``own``),
    else its message's."""
    if own:
        return format_html('<p class="help">{}</p>{}', "this job's own payload (set by a handler-driven gate move)",
                           payload_preview(table="jobs_job", pk=job_pk))
    return payload_preview(table="broker_message", pk=message_pk)
