"""The native routes: requests the web server answers without Django's request handling, the
single publish first, on the event loop.

``NATIVE_ROUTES`` is the table (one line per route); the DRF views at the same paths document them
and answer whatever a native route leaves to the full stack. Two kinds of handler:

- **on the loop** (``on_loop=True``): ``handler(native, req, request, **params) -> bool``, must not
  block: the single publish parses its message here and hands it to the process's publishing thread
  (``jobs.publish.grouped.publish_submit``), which answers a whole batch with one
  ``call_soon_threadsafe`` after its commit (``Native.publish_answers``);
- **in a pool thread** (``on_loop=False``): ``handler(request, **params) -> HttpResponse``, the
  contract of the fast lane's handlers (``web.api.fast_lane``): may use the database; Django's
  request signals run around it (connection handling), as for any request.

Same answers as the full stack (status, body, every header; tests/web/server compare them): the
checks the full stack makes first (``FastLane.admits``: allowed hosts, SSL redirect, user agent,
the HMAC signature) and a request they would refuse goes the full way; so does a request whose
message is refused before it is queued (a 400 or 413: the full stack checks the credentials first),
a scheduled one, and anything a handler declines. Answers are rendered by the same code as the fast
lane's (``FastLane.answer`` / ``refusal`` / ``finish``); the 201 of a publish from a template made by
that code (``_created_template``), remade when a setting changes.

Admission: a publish is refused at once (503 ``overloaded``, Retry-After) when the publishing
thread's queue says so (``publish_admission``) or when the event loop runs more than
BROKER_PUBLISH_ADMIT_WAIT behind (``Server.lag_max``: the process cannot keep up with what arrives).
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from urllib.parse import quote

from django.conf import settings
from django.core import signals
from django.core.handlers.wsgi import WSGIRequest
from django.core.signals import setting_changed
from django.http import HttpResponse
from django.http.request import HttpHeaders

from broker.errors import DomainError, Unavailable
from eventtypes.validation import channel_rules, channel_rules_held
from jobs.publish.grouped import WAIT_MAX, PublishItem, publish_admission, publish_submit
from jobs.publish.refusals import publish_refusal_count
from web.api import publishing
from web.api.fast_lane import FastLane, allow_header
from web.api.representations import message_url
from web.api.sources import SourceReceiveView
from web.server.current import refresh_soon
from web.server.http import Request, Server
from web.server.inbound import ROUTE as INBOUND_ROUTE, source_receive_native

logger = logging.getLogger("broker.web.native")
ERRORS_CACHED = 512  # rendered refusals kept (their text is the same for every request of a kind)
HOSTS_KEPT = 256  # the checks' verdicts kept, by host


@dataclass(frozen=True)
class NativeRoute:
    method: str
    pattern: re.Pattern
    handler: object
    view: type  # the DRF view at this path (documents it, gives the Allow header, serves the full way)
    on_loop: bool = False


class NativeRequest:
    """A request as a loop handler reads it: ``META`` (its environ), ``body``, ``headers`` (Django's
    ``HttpHeaders``, made on first use), ``is_secure()`` (Django's rule); ``django()`` makes the
    ``WSGIRequest`` that Django's own code needs (the checks of a host not seen before, the answer of
    a refusal), which a publish answered 201 never does."""

    __slots__ = ("META", "body", "_headers", "_request")

    def __init__(self, environ: dict, body: bytes) -> None:
        self.META = environ
        self.body = body
        self._headers = None
        self._request = None

    @property
    def headers(self) -> HttpHeaders:
        if self._headers is None:
            self._headers = HttpHeaders(self.META)
        return self._headers

    def is_secure(self) -> bool:
        """``HttpRequest.is_secure``: SECURE_PROXY_SSL_HEADER's first value when the header is there,
        else the server's scheme."""
        proxy = settings.SECURE_PROXY_SSL_HEADER
        if proxy:
            header, secure_value = proxy
            value = self.META.get(header)
            if value is not None:
                return value.split(",", 1)[0].strip() == secure_value
        return self.META.get("wsgi.url_scheme") == "https"

    def django(self) -> WSGIRequest:
        if self._request is None:
            self.META["wsgi.input"] = io.BytesIO(self.body)
            self._request = WSGIRequest(self.META)
        return self._request


def broadcast_native(native: Native, req: Request, request: NativeRequest, channel_id: str) -> bool:
    """``POST /channel/{id}/broadcast`` on the event loop: ``broadcast_post``'s plain publish, handed
    to the publishing thread; False (the full way) for anything else."""
    try:
        message, scheduled_for = publishing.broadcast_message(request)
        refresh_soon(native, ("event types", channel_id), channel_rules, channel_id)  # (in the pool: no query here)
        rules = channel_rules_held(channel_id)
        if rules is None:
            return False  # not held current: the full way reads them
        publishing.broadcast_event_check(channel_id, message, rules=rules)  # (a 422 is the full stack's, credentials first)
    except DomainError:
        return False  # the full stack answers it (credentials first)
    if scheduled_for or message.partition_key is not None or not settings.BROKER_PUBLISH_GROUP:
        return False  # (publish_grouped_here: the event loop's thread is never inside a transaction)
    meta = request.META
    refusal = publish_admission() or native.loop_refusal()
    if refusal is not None:
        native.refuse(req, request.django(), refusal, publishing.BroadcastView)
        return True
    item = PublishItem(channel_id, meta.get("HTTP_X_BROKER_CHANNEL_TOKEN"), meta.get("HTTP_X_BROKER_PRODUCER_ID"),
                       meta.get("HTTP_X_BROKER_PRODUCER_TOKEN"), message, reply=native.reply)
    native.pending[id(item)] = (item, req, request)
    publish_submit(item)
    return True


NATIVE_ROUTES = [
    NativeRoute("POST", re.compile(r"^/channel/(?P<channel_id>[^/]+)/broadcast\Z"), broadcast_native,
                publishing.BroadcastView, on_loop=True),
    NativeRoute("POST", INBOUND_ROUTE, source_receive_native, SourceReceiveView, on_loop=True),  # web.server.inbound
]


class Native:
    """The server's native side (``web.server.http.Server.native``): matches, checks, answers."""

    def __init__(self, routes: list[NativeRoute]) -> None:
        self.routes = routes
        self.lane = FastLane()
        self.server: Server | None = None
        self.loop = None
        self.pending: dict[int, tuple[PublishItem, Request, NativeRequest]] = {}
        self._plain: bool | None = None  # whether the checks come down to the host (``admits``)
        self._hosts: dict[tuple, bool] = {}
        self.handled = 0  # requests answered natively (tests, benchmarks)
        self._templates: dict[bool, tuple[bytes, bytes]] = {}
        self._errors: dict[tuple, tuple[bytes, bytes]] = {}
        setting_changed.connect(self._settings_changed)

    def attach(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        server.tick_hooks.append(self._tick)

    def detach(self) -> None:
        setting_changed.disconnect(self._settings_changed)

    def _settings_changed(self, **kwargs) -> None:
        """(tests) Settings changed: the middleware instances (which read some at their start) and
        the rendered answers are made again."""
        self.lane = FastLane()
        self._templates.clear()
        self._errors.clear()
        self._plain = None
        self._hosts.clear()

    # --- the server's side -----------------------------------------------------------------------

    def match(self, req: Request):
        """The route and its parameters for ``req``'s head, or None."""
        method, path = req.method, req.environ["PATH_INFO"]
        for route in self.routes:
            if route.method == method:
                found = route.pattern.match(path)
                if found is not None:
                    return route, found.groupdict()
        return None

    def handle(self, match, req: Request) -> bool:
        """``req`` (its body in) on its route; False: the full way."""
        route, params = match
        request = NativeRequest(req.environ, bytes(req.body))
        if not self.admits(request):
            return False
        if route.on_loop:
            taken = route.handler(self, req, request, **params)
            self.handled += taken
            return taken
        self.handled += 1
        self.server.wsgi_busy += 1
        self.server.executor.submit(self._in_thread, route, req, request.django(), params)
        return True

    def admits(self, request: NativeRequest) -> bool:
        """``FastLane.admits``: the checks the full stack makes first. With the settings most run
        (no SSL or www redirect, no refused user agents, no HMAC signing) they come down to the
        host, whose verdict is kept per Host / X-Forwarded-Host / server name (``_hosts``)."""
        if self._plain is None:
            self._plain = not (settings.SECURE_SSL_REDIRECT or settings.PREPEND_WWW or settings.APPEND_SLASH
                               or settings.DISALLOWED_USER_AGENTS or settings.BROKER_HMAC_SECRET)
        if not self._plain:
            return self.lane.admits(request.django())
        meta = request.META
        key = (meta.get("HTTP_HOST"), meta.get("HTTP_X_FORWARDED_HOST"), meta.get("SERVER_NAME"),
               meta.get("SERVER_PORT"))
        known = self._hosts.get(key)
        if known is None:
            if len(self._hosts) >= HOSTS_KEPT:
                self._hosts.clear()
            known = self._hosts[key] = self.lane.admits(request.django())
        return known

    def _in_thread(self, route: NativeRoute, req: Request, request: WSGIRequest, params: dict) -> None:
        """(pool thread) A thread route's answer, with Django's request signals around it."""
        signals.request_started.send(sender=self.__class__, environ=request.environ)
        try:
            response = self.lane.answer(request, route.handler, route.view, params)
            head, body = response_bytes(response)
        except Exception:  # noqa: BLE001 - as the WSGI path: a 500, logged
            logger.exception("native route failed: %s %s", req.method, request.path)
            head, body = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                          b"Content-Length: 22\r\n", b"Internal Server Error\n")
            response = None
        finally:
            if response is not None:
                response.close()  # request_finished: Django's connection handling
            else:
                signals.request_finished.send(sender=self.__class__)
        self.loop.call_soon_threadsafe(self._answered_from_thread, req, head, body)

    def _answered_from_thread(self, req: Request, head: bytes, body: bytes) -> None:
        self.server.wsgi_done()
        req.respond(head, body)

    # --- answers -----------------------------------------------------------------------------------

    def reply(self, items: list[PublishItem]) -> None:
        """(publishing thread) A batch answered: one hand-over to the loop for all of its items."""
        self.loop.call_soon_threadsafe(self.publish_answers, items)

    def publish_answers(self, items: list[PublishItem]) -> None:
        """(event loop) Each publish of a batch answered: 201 with its Location, or its refusal."""
        pending = self.pending
        for item in items:
            entry = pending.pop(id(item), None)
            if entry is None:
                continue
            _, req, request = entry
            if item.error is None and item.message_id is not None:
                self.created(req, request, item.channel_id, item.message_id)
            else:
                self.refuse(req, request.django(), item.error or Unavailable(
                    "database_unavailable", "the database is unavailable, retry shortly", retry_after=1),
                    publishing.BroadcastView)

    def created(self, req: Request, request: NativeRequest, channel_id: str, message_id: str) -> None:
        """The 201 of a publish, as ``broadcast_post`` answers it through the fast lane."""
        secure = request.is_secure()
        template = self._templates.get(secure)
        if template is None:
            template = self._templates[secure] = self._created_template(request.django())
        location = message_url(channel_id, quote(message_id, safe="-_.~")).encode("latin-1")
        req.respond(template[0] + location + template[1])

    def _created_template(self, request: WSGIRequest) -> tuple[bytes, bytes]:
        """The head of a publish's 201 around its Location value, made by the fast lane's own code."""
        marker = "\x00location\x00"
        response = HttpResponse(status=201)
        del response["Content-Type"]
        response["Location"] = marker
        response["Allow"] = allow_header(publishing.BroadcastView)
        head, _ = response_bytes(self.lane.finish(request, response))
        before, after = head.split(marker.encode("latin-1"))
        return before, after

    def refuse(self, req: Request, request: WSGIRequest, exc: Exception, view) -> None:
        """``exc`` as the DRF ``view`` answers it (a refusal's text repeats: rendered once per kind)."""
        key = (type(exc), getattr(exc, "code", None), getattr(exc, "detail", None),
               getattr(exc, "retry_after", None), request.is_secure(), view) if isinstance(exc, DomainError) else None
        answer = self._errors.get(key) if key is not None else None
        if answer is None:
            answer = response_bytes(self.lane.finish(request, self.lane.refusal(request, exc, view)))
            if key is not None:
                if len(self._errors) >= ERRORS_CACHED:
                    self._errors.clear()
                self._errors[key] = answer
        req.respond(*answer)

    # --- admission and the clock -------------------------------------------------------------------

    def loop_refusal(self) -> Unavailable | None:
        """503 ``overloaded`` when the event loop runs behind by more than BROKER_PUBLISH_ADMIT_WAIT."""
        limit = float(settings.BROKER_PUBLISH_ADMIT_WAIT)
        if limit > 0 and self.server is not None and self.server.lag_max > limit:
            publish_refusal_count(reason="event_loop")
            return Unavailable("overloaded", "the broker is over its capacity: retry after 1 s", retry_after=1)
        return None

    def _tick(self, now: float) -> None:
        """A publish the thread never answered (it hung outside its bounded round trips): 503."""
        if not self.pending:
            return
        stale = [entry for entry in self.pending.values() if now - entry[0].submitted > WAIT_MAX]
        for item, req, request in stale:
            self.pending.pop(id(item), None)
            self.refuse(req, request.django(), Unavailable("database_unavailable", "the database is unavailable, retry shortly",
                                                  retry_after=1), publishing.BroadcastView)


def response_bytes(response: HttpResponse) -> tuple[bytes, bytes]:
    """(head, body) of a Django response as the server writes what Django's WSGI handler gives it."""
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n"]
    for name, value in response.items():
        lines.append(f"{name}: {value}\r\n")
    for cookie in response.cookies.values():
        lines.append(f"Set-Cookie: {cookie.output(header='')}\r\n")
    body = response.content
    if not response.has_header("Content-Length"):
        lines.append(f"Content-Length: {len(body)}\r\n")
    return "".join(lines).encode("latin-1"), body


def native_routes() -> Native:
    """``settings.BROKER_NATIVE_ROUTES``: what the web server's workers answer natively."""
    return Native(NATIVE_ROUTES)

