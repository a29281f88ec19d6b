"""The fast lane: the hot routes (the single publish, and the pull routes: queued-jobs GET, job
state POST, pull, ack) answered without URL resolving, DRF and the rest of the middleware chain,
with the same answers (``FastLaneMiddleware``, first in ``MIDDLEWARE``; ``BROKER_FAST_LANE`` turns
it off). The route table is here; the handlers are beside the DRF views that document them and
serve every request the lane leaves to the full stack (``web.api.publishing``, ``web.api.pull``)."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.exception import response_for_exception
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from rest_framework.renderers import JSONRenderer

from web.api import publishing
from web.api.errors import exception_handler
from web.api.pull import handlers, views
from web.middleware import signature_refusal

_C = r"^/channel/(?P<channel_id>[^/]+)/consumer/(?P<consumer_id>[^/]+)"
# (method, path pattern, handler, the DRF view routed there in web.urls: documents it, sets Allow).
# <str:...> in web.urls matches [^/]+, as here, and ends in \Z as here (not $, which also matches
# before a final newline); tests check both resolve to the same view.
HOT_ROUTES = [
    ("POST", re.compile(r"^/channel/(?P<channel_id>[^/]+)/broadcast\Z"), publishing.broadcast_post,
     publishing.BroadcastView),
    ("GET", re.compile(_C + r"/queued-jobs\Z"), handlers.queued_jobs_get, views.QueuedJobsView),
    ("POST", re.compile(_C + r"/job/(?P<job_id>[^/]+)\Z"), handlers.job_state_post, views.JobView),
    ("POST", re.compile(_C + r"/pull\Z"), handlers.pull_post, views.PullView),
    ("POST", re.compile(_C + r"/ack\Z"), handlers.ack_post, views.AckView),
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


class FastLane:
    """The fast lane's checks and answers, shared by ``FastLaneMiddleware`` and the web server's
    native routes (``web.server.native``): what the full stack checks first (``admits``), a hot
    handler's answer (``answer``) and an exception as the DRF view answers it (``refusal``), with
    the response headers of the security, common and clickjacking middleware (``finish``)."""

    def __init__(self) -> None:
        self.security = SecurityMiddleware(_passthrough)
        self.common = CommonMiddleware(_passthrough)
        self.xframe = XFrameOptionsMiddleware(_passthrough)
        self.renderer = JSONRenderer()

    def admits(self, request) -> bool:
        """Whether the full stack would let ``request`` reach its view unchanged: an allowed host and
        user agent, no SSL or www redirect, a valid HMAC signature (when signing is on)."""
        try:
            return (self.security.process_request(request) is None
                    and self.common.process_request(request) is None
                    and signature_refusal(request) is None)
        except Exception:  # a disallowed host or user agent: the full stack answers it
            return False

    def answer(self, request, handler, view, params: dict) -> HttpResponse:
        """``handler``'s answer to ``request``, or its exception's, as the DRF ``view`` gives it."""
        try:
            response = handler(request, **params)
            response["Allow"] = _ALLOW[view]  # as DRF's finalize_response
        except Exception as exc:
            response = self.refusal(request, exc, view)
        return self.finish(request, response)

    def refusal(self, request, exc: Exception, view) -> HttpResponse:
        """The answer the DRF view gives for ``exc`` (not yet finished): ``exception_handler``
        rendered as its JSON renderer does, with Allow; Django's 500 for one DRF re-raises."""
        response = self.error_response(request, exc)
        if response is None:  # not one DRF handles: Django's 500 (logged, handler500), no Allow
            return response_for_exception(request, exc)
        response["Allow"] = _ALLOW[view]
        return response

    def finish(self, request, response: HttpResponse) -> HttpResponse:
        """The response headers the middleware after the fast lane adds, in their order."""
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


def allow_header(view) -> str:
    """The Allow header DRF gives the answers of ``view`` (a view of ``HOT_ROUTES`` or the native routes)."""
    return _ALLOW.get(view) or _ALLOW.setdefault(view, _allow(view))


class FastLaneMiddleware:
    """The hot routes (the single publish; queued-jobs GET, job state POST, pull, ack) in the common
    case, without URL resolving, DRF dispatch and the middleware chain: those cost ~0.3 ms of CPU
    per request, as much as the handler and its SQL; the spec path makes three requests per job.

    Same answers as the full stack, byte for byte (status, body, headers; tests compare them):
    the same handler functions the DRF views call, the same error rendering (``exception_handler``
    then DRF's JSON renderer), DRF's ``Allow`` header, and the response headers of the security,
    common and clickjacking middleware, run here on the same request. Host validation, SSL redirect
    and the HMAC signature are checked first. Anything unusual goes the full way unchanged: another
    path or method, a request those checks would refuse or redirect, or queued-jobs with
    X-Broker-Admin-Token (its staff-session alternative needs the session and auth middleware).
    Django's request signals still run (the connection handling around every request)."""

    def __init__(self, get_response):
        if not settings.BROKER_FAST_LANE:
            raise MiddlewareNotUsed("BROKER_FAST_LANE is off")
        self.get_response = get_response
        self.lane = FastLane()

    def __call__(self, request):
        method = request.method
        for route_method, pattern, handler, view in HOT_ROUTES:
            if method == route_method:
                match = pattern.match(request.path_info)
                if match is not None:
                    break
        else:
            return self.get_response(request)
        if route_method == "GET" and handlers.ADMIN_META in request.META:
            return self.get_response(request)
        if not self.lane.admits(request):
            return self.get_response(request)
        request.broker_fast_lane = True  # (tests check which way a request went)
        return self.lane.answer(request, handler, view, match.groupdict())
