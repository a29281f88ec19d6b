"""Tokens: constant-time comparison and generation. Tokens are never logged or echoed."""

from __future__ import annotations

import hmac
import secrets


def tokens_equal(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def token_generate() -> str:
    return secrets.token_urlsafe(16)
