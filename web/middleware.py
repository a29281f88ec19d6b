"""The broker's middleware: optional HMAC request signing, and the pull routes' fast lane.

HMAC request signing for ingestion, as webhook-broker's gateway offers it.

With ``BROKER_HMAC_SECRET`` (base64) set, every request outside ``BROKER_HMAC_EXEMPT_PATHS`` must
carry ``X-Broker-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>``:
missing or malformed 401, timestamp outside ``BROKER_HMAC_TOLERANCE`` seconds 403, wrong signature
403 (constant-time compare). Per-object tokens are still checked after it; a verified request is
marked (``request.broker_signed``) so the registry endpoints accept it without the admin token
(``web.auth.registry_allowed``), as webhook-broker's gateway auth does.

The fast lane (``PullFastLaneMiddleware``, first in ``MIDDLEWARE``) answers the hot pull routes
without the rest of the stack; see its docstring.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import re
import time

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.exception import response_for_exception
from django.http import HttpResponse, JsonResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from rest_framework.renderers import JSONRenderer

from web.api import pull, pull_hot
from web.api.errors import exception_handler

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


# --- the pull routes' fast lane ---------------------------------------------------------------------

_C = r"^/channel/(?P<channel_id>[^/]+)/consumer/(?P<consumer_id>[^/]+)"
# (method, path pattern, handler, the DRF view routed there in web.urls: documents it, sets Allow).
# <str:...> in web.urls matches [^/]+, as here, and ends in \Z as here (not $, which also matches
# before a final newline); tests check both resolve to the same view.
HOT_ROUTES = [
    ("GET", re.compile(_C + r"/queued-jobs\Z"), pull_hot.queued_jobs_get, pull.QueuedJobsView),
    ("POST", re.compile(_C + r"/job/(?P<job_id>[^/]+)\Z"), pull_hot.job_state_post, pull.JobView),
    ("POST", re.compile(_C + r"/pull\Z"), pull_hot.pull_post, pull.PullView),
    ("POST", re.compile(_C + r"/ack\Z"), pull_hot.ack_post, pull.AckView),
]
# What the fast lane does in place of each middleware after it, as configured: "run" (the same
# instance methods, on the same request), "checked" (verified here; a refusal goes the full way)
# or "idle" (does nothing on these routes: no hot handler reads a session, user or message, the
# DRF views are csrf_exempt, no static file lives there). A middleware added to MIDDLEWARE must be
# reviewed and entered here (a test compares this with the setting).
SKIPPED_MIDDLEWARE = {
    "django.middleware.security.SecurityMiddleware": "run",
    "whitenoise.middleware.WhiteNoiseMiddleware": "idle",
    "django.contrib.sessions.middleware.SessionMiddleware": "idle",
    "django.middleware.common.CommonMiddleware": "run",
    "web.middleware.HmacSignatureMiddleware": "checked",
    "django.middleware.csrf.CsrfViewMiddleware": "idle",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "idle",
    "django.contrib.messages.middleware.MessageMiddleware": "idle",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "run",
}


def _allow(view) -> str:
    """DRF's Allow header: the view's methods (Django's View.setup adds HEAD where there is a GET)."""
    return ", ".join(m.upper() for m in view.http_method_names
                     if hasattr(view, m) or (m == "head" and hasattr(view, "get")))


_ALLOW = {view: _allow(view) for _, _, _, view in HOT_ROUTES}


def _passthrough(request):
    return None


class PullFastLaneMiddleware:
    """The hot pull routes (queued-jobs GET, job state POST, pull, ack) in the common case, without
    URL resolving, DRF dispatch and the middleware chain: those cost ~0.3 ms of CPU per request,
    as much as the handler and its one SQL statement; the spec path makes three requests per job.

    Same answers as the full stack, byte for byte (status, body, headers; tests compare them):
    the same handler functions the DRF views call, the same error rendering (``exception_handler``
    then DRF's JSON renderer), DRF's ``Allow`` header, and the response headers of the security,
    common and clickjacking middleware, run here on the same request. Host validation, SSL redirect
    and the HMAC signature are checked first. Anything unusual goes the full way unchanged: another
    path or method, a request those checks would refuse or redirect, or queued-jobs with
    X-Broker-Admin-Token (its staff-session alternative needs the session and auth middleware).
    Django's request signals still run (the connection handling around every request)."""

    def __init__(self, get_response):
        if not settings.BROKER_PULL_FAST_LANE:
            raise MiddlewareNotUsed("BROKER_PULL_FAST_LANE is off")
        self.get_response = get_response
        self.security = SecurityMiddleware(_passthrough)
        self.common = CommonMiddleware(_passthrough)
        self.xframe = XFrameOptionsMiddleware(_passthrough)
        self.renderer = JSONRenderer()

    def __call__(self, request):
        method = request.method
        for route_method, pattern, handler, view in HOT_ROUTES:
            if method == route_method:
                match = pattern.match(request.path_info)
                if match is not None:
                    break
        else:
            return self.get_response(request)
        if route_method == "GET" and pull_hot.ADMIN_META in request.META:
            return self.get_response(request)
        try:
            if (self.security.process_request(request) is not None
                    or self.common.process_request(request) is not None
                    or signature_refusal(request) is not None):
                return self.get_response(request)
        except Exception:  # a disallowed host or user agent: the full stack answers it
            return self.get_response(request)
        request.broker_fast_lane = True  # (tests check which way a request went)
        try:
            response = handler(request, **match.groupdict())
            response["Allow"] = _ALLOW[view]  # as DRF's finalize_response
        except Exception as exc:
            response = self.error_response(request, exc)
            if response is None:  # not one DRF handles: Django's 500 (logged, handler500), no Allow
                response = response_for_exception(request, exc)
            else:
                response["Allow"] = _ALLOW[view]
        response = self.xframe.process_response(request, response)
        response = self.common.process_response(request, response)
        return self.security.process_response(request, response)

    def error_response(self, request, exc: Exception) -> HttpResponse | None:
        """The answer the DRF view gives (``exception_handler``: domain errors, database down, bad
        UTF-8), rendered as its JSON renderer does; None for an exception DRF re-raises."""
        drf = exception_handler(exc, None)
        if drf is None:
            return None
        response = HttpResponse(self.renderer.render(drf.data), status=drf.status_code,
                                content_type="application/json")
        for key, value in drf.headers.items():
            if key.lower() != "content-type":  # a DRF Response gets its content type when rendered
                response[key] = value
        return response
