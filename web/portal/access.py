"""Who may see a portal page: the link opening, the check every page runs first (``portal_page``),
signing out, and the plain pages that refuse (403 ended, idle or missing session, 404 anything that
is not this session's consumer, 429 too many openings).

Opening a link takes a person's button: following it (``GET /portal/open/<token>``, what a mail
scanner or a chat's link preview also does) is rate-limited and checked, keeps the token in a
short-lived cookie for ``/portal/open`` only and moves on to ``/portal/open``, a page without the
token that names the consumer and has an "Open the portal" button; its POST makes the session (its
own cookie) and moves on to the consumer's overview. So no GET makes a live session, and the token
leaves the address bar and the browser's history at once.

What a refusal reveals: nothing of any consumer. A page of another consumer or channel, existing
or not, is the same 404 as a page that never existed; every portal answer carries
``Cache-Control: no-store`` and ``Referrer-Policy: same-origin`` (nothing of a portal address leaves the
broker; ``no-referrer`` would make browsers send ``Origin: null`` with the forms, which CSRF refuses),
and is kept out of search engines.
"""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from django.http import HttpResponseRedirect
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.urls import reverse

from broker.db.errors import database_unavailable
from broker.durations import duration_format
from broker.errors import RateLimited
from web.portal.links import (PortalAccess, PortalDenied, portal_link_check, portal_link_find, portal_link_open,
                              portal_session_end, portal_session_find)

logger = logging.getLogger("web.portal")
COOKIE = "broker_portal"
COOKIE_PATH = "/portal/"
PENDING = "broker_portal_link"  # the followed link's token, until the person's button opens it
PENDING_PATH = "/portal/open"
PENDING_SECONDS = 600

DENIED = {  # PortalDenied.reason -> (title, text)
    "invalid": ("No portal session", "This page needs a portal link. Open the link you were given; if it no longer "
                                     "works, ask the broker's operator for a new one."),
    "expired": ("Portal link expired", "This portal link has expired. Ask the broker's operator for a new one."),
    "revoked": ("Portal link revoked", "This portal link was revoked. Ask the broker's operator for a new one."),
    "read": ("Read-only portal link", "This portal link may look but not change anything."),
    "idle": ("Portal session ended", "This portal session ended after {idle} without activity. Open your portal "
                                     "link again to start a new one."),
}


def secured(response):
    """The headers of every portal answer."""
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "same-origin"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


def plain_page(request, status: int, title: str, text: str, headers: dict | None = None):
    """A refusal: its title and one sentence, nothing else (no link, no name, no trace)."""
    response = SimpleTemplateResponse("portal/plain.html", {"title": title, "text": text}, status=status,
                                      headers=headers)
    return secured(response)


def denied_page(request, reason: str):
    title, text = DENIED[reason]
    return plain_page(request, 403, title, text.format(idle=duration_format(
        int(settings.BROKER_PORTAL_IDLE.total_seconds()))))


def not_found_page(request, *args, **kwargs):
    return plain_page(request, 404, "Not found", "There is no such page in this portal.")


def _unlogged(view):
    """Answer everything in the view, never logging the request: Django would log a failed request
    with its URL, which may hold the token (``django.request``, unless marked as logged already)."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            response = view(request, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - answered here, logged without the request
            if database_unavailable(exc):
                response = plain_page(request, 503, "Try again shortly", "The broker's database is unavailable; "
                                      "try again in a moment.", headers={"Retry-After": "1"})
            else:
                logger.exception("opening a portal link failed")  # the traceback, never the URL
                response = plain_page(request, 500, "Something went wrong",
                                      "The portal could not be opened; try again later.")
        response._has_been_logged = True  # (django.utils.log.log_response)
        return response

    return wrapper


def _too_many(request, exc: RateLimited):
    return plain_page(request, 429, "Too many portal links opened",
                      "Too many portal links were opened from this address; wait a minute and try again.",
                      headers={"Retry-After": str(exc.retry_after)})


@_unlogged
def link_open_view(request, token: str):
    """A link followed (GET): checked, no session made; the token moves to a cookie for
    ``/portal/open`` only and the browser to that page (the token leaves the address bar)."""
    if request.method != "GET":
        return not_found_page(request)
    try:
        portal_link_check(token=token, address=request.META.get("REMOTE_ADDR") or "-")
    except RateLimited as exc:
        return _too_many(request, exc)
    except PortalDenied as exc:
        return denied_page(request, exc.reason)
    response = secured(HttpResponseRedirect(reverse("portal:start")))
    response.set_cookie(PENDING, token, max_age=PENDING_SECONDS, path=PENDING_PATH, httponly=True, samesite="Lax",
                        secure=settings.SESSION_COOKIE_SECURE)
    return response


@_unlogged
def link_start_view(request):
    """``/portal/open``: GET names the consumer the followed link opens, with the "Open the portal"
    button; its POST starts the session (a cookie for /portal/ until the link ends) and moves on to
    the consumer's overview."""
    token = request.COOKIES.get(PENDING)
    if request.method == "GET":
        try:
            link = portal_link_find(token=token)
        except PortalDenied as exc:
            return denied_page(request, exc.reason)
        return secured(TemplateResponse(request, "portal/start.html", {"title": "Open the delivery portal",
                                                                       "link": link, "consumer": link.consumer}))
    if request.method != "POST":
        return plain_page(request, 405, "Not allowed", "This page does not take that request.",
                          headers={"Allow": "GET, POST"})
    try:
        key, link = portal_link_open(token=token or "", address=request.META.get("REMOTE_ADDR") or "-")
    except RateLimited as exc:
        return _too_many(request, exc)
    except PortalDenied as exc:
        return denied_page(request, exc.reason)
    response = secured(HttpResponseRedirect(reverse("portal:overview", kwargs={
        "channel_id": link.consumer.channel.channel_id, "consumer_id": link.consumer.consumer_id})))
    response.set_cookie(COOKIE, key, expires=link.expires_at, path=COOKIE_PATH, httponly=True, samesite="Lax",
                        secure=settings.SESSION_COOKIE_SECURE)
    response.delete_cookie(PENDING, path=PENDING_PATH, samesite="Lax")
    return response


def portal_page(view=None, *, methods=("GET",), read_may_post=False):
    """Run ``view(request, access, **kwargs)`` for the session's own consumer only: 403 without an
    open session, 404 for another channel or consumer (or a push-only page of a pull consumer: the
    view says so by answering None), 403 for a change asked with a ``read`` link (unless
    ``read_may_post``: signing out); 405 for other methods."""
    if view is None:
        return functools.partial(portal_page, methods=methods, read_may_post=read_may_post)

    @functools.wraps(view)
    def wrapper(request, channel_id: str, consumer_id: str, **kwargs):
        try:
            access = portal_session_find(key=request.COOKIES.get(COOKIE))
        except PortalDenied as exc:
            return denied_page(request, exc.reason)
        consumer = access.consumer
        if (channel_id, consumer_id) != (consumer.channel.channel_id, consumer.consumer_id):
            return not_found_page(request)
        if request.method not in methods:
            return plain_page(request, 405, "Not allowed", "This page does not take that request.",
                              headers={"Allow": ", ".join(methods)})
        if request.method == "POST" and not access.can_manage and not read_may_post:
            return denied_page(request, "read")
        response = view(request, access, **kwargs)
        return secured(response) if response is not None else not_found_page(request)

    return wrapper


def page_context(access: PortalAccess, current: str, **extra) -> dict:
    """What the portal's base template needs: the consumer's names, the scope, the navigation."""
    consumer = access.consumer
    ids = consumer_ids(access)
    pages = [("overview", "Overview"), ("deliveries", "Deliveries"), ("dead_letters", "Dead letters"),
             ("replay", "Replay")]
    if not consumer.is_pull:
        pages.append(("endpoint", "Endpoint"))
    pages.append(("event_catalog", "Event catalog"))  # issue 37: web.portal.catalog
    return {"access": access, "consumer": consumer, "ids": ids, "can_manage": access.can_manage,
            "nav": [{"url": reverse(f"portal:{name}", kwargs=ids), "text": text, "current": name == current}
                    for name, text in pages], **extra}


def page_render(request, access: PortalAccess, template: str, current: str, **context) -> TemplateResponse:
    """A portal page (``portal/<template>``), ``current`` the navigation entry it is under."""
    return TemplateResponse(request, f"portal/{template}", page_context(access, current, **context))


def page_redirect(access: PortalAccess, name: str) -> HttpResponseRedirect:
    """Back to one of the consumer's portal pages (after a change: the browser's reload repeats nothing)."""
    return HttpResponseRedirect(reverse(f"portal:{name}", kwargs=consumer_ids(access)))


def consumer_ids(access: PortalAccess) -> dict:
    consumer = access.consumer
    return {"channel_id": consumer.channel.channel_id, "consumer_id": consumer.consumer_id}


@portal_page(methods=("POST",), read_may_post=True)
def sign_out_view(request, access: PortalAccess):
    """"Sign out": the session ends and its cookie goes (the link stays: opening it again starts another)."""
    portal_session_end(access=access)
    response = plain_page(request, 200, "Signed out", "You signed out of the delivery portal. Open your portal link "
                                                      "again to come back.")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, samesite="Lax")
    return response
