"""HMAC request signing for ingestion, as webhook-broker's gateway offers it.

With ``BROKER_HMAC_SECRET`` (base64) set, every request outside ``BROKER_HMAC_EXEMPT_PATHS`` must
carry ``X-Broker-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>``:
missing or malformed 401, timestamp outside ``BROKER_HMAC_TOLERANCE`` seconds 403, wrong signature
403 (constant-time compare). Per-object tokens are still checked after it; a verified request is
marked (``request.broker_signed``) so the registry endpoints accept it without the admin token
(``web.auth.registry_allowed``), as webhook-broker's gateway auth does.

(The hot routes' fast lane, first in ``MIDDLEWARE``, is ``web.api.fast_lane``.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import time

from django.conf import settings
from django.http import JsonResponse

logger = logging.getLogger("broker.auth")

def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail}, status=status)


def signature_parse(header: str) -> tuple[int, list[str]] | None:
    """``t=...,v1=...[,v1=...]`` -> (timestamp, [hex signatures]); None when malformed."""
    timestamp, signatures = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                return None
        elif key == "v1" and value:
            signatures.append(value.lower())
    if timestamp is None or not signatures:
        return None
    return timestamp, signatures


def signature_make(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


class HmacSignatureMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        # Built once per web process when it loads its middleware: the start-up warning.
        if settings.BROKER_REGISTRY_AUTH == "open":
            logger.warning("BROKER_REGISTRY_AUTH=open: the registry endpoints (producers, channels, consumers, "
                           "/dlq-status, /job-status) accept requests without credentials; only run this "
                           "behind a gateway that authenticates every request")

    def __call__(self, request):
        refusal = signature_refusal(request)
        if refusal is not None:
            return refusal
        return self.get_response(request)


def signature_refusal(request) -> JsonResponse | None:
    """None when the request may go on (signing off, an exempt path, or a valid signature: then
    ``request.broker_signed`` is set); else the 401/403/500 answer."""
    secret_b64 = settings.BROKER_HMAC_SECRET
    if not secret_b64 or any(request.path.startswith(p) for p in settings.BROKER_HMAC_EXEMPT_PATHS):
        return None
    try:
        secret = base64.b64decode(secret_b64, validate=True)
    except (binascii.Error, ValueError):
        return _error(500, "misconfigured", "BROKER_HMAC_SECRET is not valid base64")
    header = request.headers.get("X-Broker-Signature")
    parsed = signature_parse(header) if header else None
    if parsed is None:
        return _error(401, "signature_required", "X-Broker-Signature: t=<unix>,v1=<hex> is required")
    timestamp, signatures = parsed
    if abs(time.time() - timestamp) > settings.BROKER_HMAC_TOLERANCE:
        return _error(403, "signature_expired", "signature timestamp is outside the tolerance window")
    expected = signature_make(secret, timestamp, request.body)
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        return _error(403, "signature_mismatch", "signature does not match")
    request.broker_signed = True
    return None
