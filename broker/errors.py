"""Domain errors: what went wrong, named for what it means, never for an HTTP status.

Services raise them with a machine-readable ``code`` and a human-readable ``detail``; the web layer
(``web/api/errors.py``) maps each class to its HTTP answer in one table, so domain code never
speaks HTTP and every caller (API, admin, commands) can tell refusals apart by class.
"""

from __future__ import annotations


class DomainError(Exception):
    """A refused request or operation. ``headers``: extra answer headers the refusal carries."""

    def __init__(self, code: str, detail: str, *, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


class InvalidInput(DomainError):
    """The input is malformed, out of range or not allowed in this state."""


class Unauthenticated(DomainError):
    """Credentials are missing, or name nobody."""


class Forbidden(DomainError):
    """Credentials are given but do not allow this."""


class NotFound(DomainError):
    """The named object does not exist (or is not the caller's)."""


class Conflict(DomainError):
    """The object's current state rules the operation out (duplicate, already done, lost race)."""


class PreconditionFailed(DomainError):
    """A condition the caller stated (or the object's kind) does not hold."""


class Unprocessable(DomainError):
    """The input is well-formed but its content breaks a rule it is held to (a payload against its
    event type's schema). ``path``: the JSON pointer of the fault in the input, when there is one."""

    def __init__(self, code: str, detail: str, *, path: str | None = None, headers: dict | None = None) -> None:
        super().__init__(code, detail, headers=headers)
        self.path = path


class TooLarge(DomainError):
    """The input is larger than allowed."""


class UnsupportedMediaType(DomainError):
    """The input's content type is not one this operation reads."""


class Locked(DomainError):
    """Someone else holds the object (a priority group's pin)."""


class RateLimited(DomainError):
    """Not now: try again after ``retry_after`` seconds."""

    def __init__(self, code: str, detail: str, *, retry_after: int | float, headers: dict | None = None) -> None:
        super().__init__(code, detail, headers=headers)
        self.retry_after = retry_after


class Unavailable(DomainError):
    """A resource the operation needs is down: try again after ``retry_after`` seconds."""

    def __init__(self, code: str, detail: str, *, retry_after: int | float, headers: dict | None = None) -> None:
        super().__init__(code, detail, headers=headers)
        self.retry_after = retry_after
