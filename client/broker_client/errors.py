"""Exceptions carrying the broker's error code.

The broker answers every error as JSON ``{"error": code, "detail": text}``; callers branch on
``code`` (``duplicate_message_id``, ``rate_limited``, ``pin_id_mismatch`` ...), never on the text.
"""

from __future__ import annotations


class BrokerError(Exception):
    """An error answer of the broker (``status``, ``code``, ``detail``; ``retry_after`` in seconds
    when the answer carried ``Retry-After``)."""

    def __init__(self, status: int, code: str, detail: str = "", *, retry_after: float | None = None,
                 response=None):
        super().__init__(f"{status} {code}: {detail}" if detail else f"{status} {code}")
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after
        self.response = response


class BadRequest(BrokerError):
    """400: malformed input (the code names the field)."""


class Unauthorized(BrokerError):
    """401: a token (or the request signature) is missing, or the producer is unknown."""


class Forbidden(BrokerError):
    """403: a token does not match."""


class NotFound(BrokerError):
    """404: unknown channel, consumer, job, message ..."""


class Conflict(BrokerError):
    """409: duplicate message id (on a first attempt), dispatched scheduled message, closed
    partition, gate passed, job not in flight."""


class PreconditionFailed(BrokerError):
    """412: e.g. a push consumer on the pull endpoints, a schedule too soon."""


class PayloadTooLarge(BrokerError):
    """413: body over ``BROKER_MAX_PAYLOAD_BYTES`` (or an oversized pull/ack body)."""


class PinMismatch(BrokerError):
    """423: the pin id of a pull is no longer the group's pin (``pin_id_mismatch``, ``wrong_pin_id``)."""


class RateLimited(BrokerError):
    """429: producer rate limit (``rate_limited``) or a consumer's backlog cap (``backlog_full``),
    after the client's retries ran out."""


class Unavailable(BrokerError):
    """502/503/504: the broker or its database is unavailable, after the client's retries ran out."""


class JobError(BrokerError):
    """One job's outcome was refused in a batch ack (``conflict``: the job is no longer in flight,
    e.g. its deadline passed and it was requeued; ``not_found``). ``job_status`` is its status then."""

    def __init__(self, job_id: str, code: str, detail: str = "", *, job_status: str | None = None):
        super().__init__(409 if code == "conflict" else 404, code, f"job {job_id}: {detail or code}")
        self.job_id = job_id
        self.job_status = job_status


class WebhookVerificationError(Exception):
    """A webhook's signature, id or timestamp is missing, malformed, stale or does not match."""


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
              412: PreconditionFailed, 413: PayloadTooLarge, 423: PinMismatch, 429: RateLimited,
              502: Unavailable, 503: Unavailable, 504: Unavailable}


def error_from_response(response, *, retry_after: float | None = None) -> BrokerError:
    """The exception for an error answer; the JSON body's ``error`` is the code (``http_<status>``
    when the body is not the broker's JSON, e.g. from a proxy)."""
    code, detail = f"http_{response.status_code}", ""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code, detail = body["error"], str(body.get("detail") or "")
    elif response.text:
        detail = response.text[:200]
    cls = _BY_STATUS.get(response.status_code, BrokerError)
    return cls(response.status_code, code, detail, retry_after=retry_after, response=response)
