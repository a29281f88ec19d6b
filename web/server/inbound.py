"""``POST /in/{id}`` (a provider's webhook to an inbound source) on the event loop.

The common case costs no Django request, no thread and no query of its own: the source and its
channel's event types as this process holds them (``sources.lookup.source_cached``,
``eventtypes.validation.channel_rules_held``; read again in the server's pool when due,
``web.server.current``: the loop never waits for them, and a change is still seen within about a
second), its signature, delivery id
and type checked on the loop (``sources.receive.source_request_prepare``, the full stack's own code:
an HMAC costs microseconds), and the message handed to the process's publishing thread (the group
commit) as a single publish is (``web.server.native.broadcast_native``). The provider is answered
only once the batch is committed: the source's accepted answer for a stored message and for a
redelivery (the ``sources_message_check`` trigger skips a delivery id it holds, in the statement
that stores the message, so two copies in one batch publish once), rendered as the full stack
renders it, and counted in the source's tally as the full stack counts it.

Everything else goes the full way (``web.api.sources.SourceReceiveView``), which answers and counts
it as it always does: a source or event types not held (the first request, or after a quiet
spell), a refusal (401 / 403 / 404 / 413 / 422; the full way reads a source again when a signature
fails just after a secret rotated), and a publish the thread refused (a token changed, the source
deleted since, 429, 503): nothing of it was stored, and the full way publishes it again and answers
what it meets. A publish refused at once by admission (503 ``overloaded``) is answered here.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter

from django.conf import settings
from django.http import HttpResponse

from broker.errors import DomainError, Unavailable
from eventtypes.validation import channel_rules
from jobs.publish.grouped import WAIT_MAX, PublishItem, publish_admission, publish_submit
from sources.lookup import SOURCES_PRODUCER, source_cached, source_lookup
from sources.receive import SourceAnswer, WouldBlock, source_request_prepare
from sources.tallies import ACCEPTED, DUPLICATE, source_request_count
from web.api.fast_lane import allow_header
from web.api.sources import SourceReceiveView, request_headers
from web.server.current import refresh_soon

ROUTE = re.compile(r"^/in/(?P<source_id>[^/]+)\Z")  # web.urls: path("in/<str:source_id>")
ANSWERS_KEPT = 256  # rendered accepted answers kept (one per source's answer and scheme)


class Inbound:
    """A web server's (``Native``'s) sources side: the publishes waiting for their commit, and the
    rendered accepted answers."""

    def __init__(self, native) -> None:
        self.native = native
        self.pending: dict[int, tuple[PublishItem, object, object, SourceAnswer]] = {}
        self.answers: dict[tuple, tuple[bytes, bytes]] = {}
        self.lane = None  # the FastLane the answers were rendered with (a settings change makes another)
        native.server.tick_hooks.append(self._tick)

    def submit(self, req, request, received) -> None:
        source = received.source
        item = PublishItem(source.channel_id, source.channel_token, SOURCES_PRODUCER, source.producer_token,
                           received.message, reply=self.reply)
        self.pending[id(item)] = (item, req, request, received)
        publish_submit(item)

    def reply(self, items: list[PublishItem]) -> None:
        """(publishing thread) A batch answered: one hand-over to the loop for its items."""
        self.native.loop.call_soon_threadsafe(self.committed, items)

    def committed(self, items: list[PublishItem]) -> None:
        """(event loop) Stored, or a redelivery: the accepted answer; anything else: the full way."""
        counts: Counter = Counter()
        for item in items:
            entry = self.pending.pop(id(item), None)
            if entry is None:
                continue
            _, req, request, received = entry
            error = item.error
            if error is None and item.message_id is not None:
                outcome = ACCEPTED
            elif isinstance(error, DomainError) and error.code == "duplicate_message_id":
                outcome = DUPLICATE  # the trigger skipped it: a delivery id within the window
            else:  # refused, nothing stored: the full stack publishes it again and answers what it meets
                req.native = None
                try:
                    self.native.server.wsgi_submit(req.conn, req)
                except RuntimeError:  # the pool is shut down (the worker stops): 503, the provider retries
                    self.native.server.wsgi_done()
                    self.native.refuse(req, request.django(), Unavailable(
                        "database_unavailable", "the database is unavailable, retry shortly", retry_after=1),
                        SourceReceiveView)
                continue
            counts[(received.source.pk, outcome)] += 1
            self.respond(req, request, received.answer)
        for (pk, outcome), n in counts.items():
            source_request_count(source_pk=pk, outcome=outcome, n=n)

    def respond(self, req, request, answer: SourceAnswer) -> None:
        """``answer`` as ``SourceReceiveView`` gives it (DRF's Allow, the middleware's headers)."""
        native = self.native
        if self.lane is not native.lane:
            self.lane = native.lane
            self.answers.clear()
        key = (answer.status, answer.content_type, answer.body, request.is_secure())
        rendered = self.answers.get(key)
        if rendered is None:
            response = HttpResponse(answer.body, status=answer.status)
            if answer.content_type:
                response["Content-Type"] = answer.content_type
            else:
                del response["Content-Type"]
            response["Allow"] = allow_header(SourceReceiveView)
            response = native.lane.finish(request.django(), response)
            status = f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n".encode("latin-1")
            rendered = (status + response.serialize_headers() + b"\r\n", response.content)
            if len(self.answers) >= ANSWERS_KEPT:
                self.answers.clear()
            self.answers[key] = rendered
        req.respond(*rendered)

    def _tick(self, now: float) -> None:
        """A publish the thread never answered (it hung outside its bounded round trips): 503."""
        stale = [entry for entry in self.pending.values() if now - entry[0].submitted > WAIT_MAX]
        for item, req, request, received in stale:
            self.pending.pop(id(item), None)
            refusal = Unavailable("database_unavailable", "the database is unavailable, retry shortly", retry_after=1)
            source_request_count(source_pk=received.source.pk, outcome=refusal.code,
                                 remote=request.META.get("REMOTE_ADDR", ""))
            self.native.refuse(req, request.django(), refusal, SourceReceiveView)


_inbound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Native -> Inbound


def source_receive_native(native, req, request, source_id: str) -> bool:
    """``POST /in/{id}`` on the event loop (a ``NativeRoute`` handler); False: the full way."""
    source = source_cached(source_id=source_id)
    if source is None or not settings.BROKER_PUBLISH_GROUP:
        return False
    inbound = _inbound.get(native)
    if inbound is None:
        inbound = _inbound[native] = Inbound(native)
    refresh_soon(native, ("source", source_id), source_lookup, source_id=source_id)  # (read only when due)
    refresh_soon(native, ("event types", source.channel_id), channel_rules, source.channel_id)
    try:
        received = source_request_prepare(source=source, headers=request_headers(request.META), body=request.body,
                                          blocking=False)
    except (DomainError, WouldBlock):
        return False  # the full stack answers and counts it (reading what it needs again)
    if received.message is None:  # answered without a message (Slack's URL check)
        source_request_count(source_pk=received.source.pk, outcome=received.outcome)
        inbound.respond(req, request, received.answer)
        return True
    refusal = publish_admission() or native.loop_refusal()
    if refusal is not None:
        source_request_count(source_pk=received.source.pk, outcome=refusal.code, detail=refusal.detail,
                             remote=request.META.get("REMOTE_ADDR", ""))
        native.refuse(req, request.django(), refusal, SourceReceiveView)
        return True
    inbound.submit(req, request, received)
    return True
