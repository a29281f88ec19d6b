"""Tokens: constant-time comparison and generation. Tokens are never logged or echoed."""

from __future__ import annotations

import hmac
import secrets

from broker.errors import Forbidden, Unauthenticated


def tokens_equal(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def token_require(given: str | None, expected: str | None, *, header: str, code: str, detail: str) -> None:
    """A required token header: missing is 401 ``unauthorized``, wrong is 403 ``code``; neither answer
    says anything about the expected token."""
    if given is None:
        raise Unauthenticated("unauthorized", f"{header} is required")
    if not tokens_equal(given, expected):
        raise Forbidden(code, detail)


def token_generate() -> str:
    return secrets.token_urlsafe(16)
