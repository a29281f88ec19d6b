"""Portal links and sessions: make a link, open it (a session scoped to its one consumer), find the
session a request belongs to, revoke. The API view, the pages and the admin all call these.

Times are the database's (``Now()``), as every other deadline of the broker. A link's token and a
session's cookie value leave this module once, to the caller that hands them out; only their
hashes are stored (``rules.token_hash``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from broker.errors import RateLimited
from consumers.models import Advisory, Consumer
from jobs.advisories.record import advisory_record
from web.portal.models import PortalLink, PortalOpenCount, PortalSession, Scope
from web.portal.rules import (TEST_EVENTS_PER_MINUTE, access_state, link_label, rate_minute, rate_retry_after, seen_every,
                              session_idle, token_hash, token_new)

KEEP_ENDED = timedelta(days=30)  # ended links (and their sessions) stay this long, for the admin
TOKEN_MAX = 128  # characters of a token or cookie worth hashing; longer ones name nothing


class PortalDenied(Exception):
    """No portal for this request: ``reason`` is ``invalid`` (no such link or session), ``expired``,
    ``revoked`` or ``idle`` (a session left without a request for ``BROKER_PORTAL_IDLE``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PortalAccess:
    """A request's portal session: its link and the one consumer (channel selected) it shows."""

    session: PortalSession
    link: PortalLink
    consumer: Consumer

    @property
    def can_manage(self) -> bool:
        return self.link.scope == Scope.MANAGE

    @property
    def label(self) -> str:
        """How advisories name the link."""
        return link_label(self.link.pk)


def portal_link_create(*, consumer: Consumer, ttl_seconds: int, scope: str, created_by: str) -> tuple[PortalLink, str]:
    """A new link to the consumer's portal; returns it and its token (never stored: only its hash).
    Links that ended more than KEEP_ENDED ago go with their sessions."""
    token = token_new()
    with transaction.atomic():
        PortalLink.objects.filter(Q(expires_at__lt=Now() - KEEP_ENDED) | Q(revoked_at__lt=Now() - KEEP_ENDED)).delete()
        link = PortalLink.objects.create(consumer=consumer, token_hash=token_hash(token), scope=scope,
                                         created_by=created_by[:160], created_at=Now(),
                                         expires_at=Now() + timedelta(seconds=ttl_seconds))
    link.refresh_from_db(fields=["created_at", "expires_at"])
    return link, token


def portal_links_revoke(*, by: str, consumer: Consumer | None = None, link_ids=None) -> int:
    """End links at once, with every session opened with them: all of ``consumer``'s, or the given
    ones. Returns how many links were still open; records an advisory per consumer concerned."""
    links = PortalLink.objects.filter(revoked_at__isnull=True)
    if consumer is not None:
        links = links.filter(consumer_id=consumer.pk)
    if link_ids is not None:
        links = links.filter(pk__in=list(link_ids))
    with transaction.atomic():
        ended = list(links.select_for_update().values_list("pk", "consumer_id"))
        PortalLink.objects.filter(pk__in=[pk for pk, _ in ended]).update(revoked_at=Now(), revoked_by=by[:160])
        PortalSession.objects.filter(link_id__in=[pk for pk, _ in ended], revoked_at__isnull=True).update(
            revoked_at=Now())
        for target in Consumer.objects.filter(pk__in={c for _, c in ended}).select_related("channel"):
            advisory_record(type="portal_links_revoked", channel=target.channel.channel_id,
                            consumer=target.consumer_id, consumer_pk=target.pk,
                            data={"links": sorted(pk for pk, c in ended if c == target.pk), "by": by})
    return len(ended)


def portal_sessions_revoke(*, session_ids) -> int:
    """End some sessions (the admin), their links left open."""
    return PortalSession.objects.filter(pk__in=list(session_ids), revoked_at__isnull=True).update(revoked_at=Now())


def portal_rate_take(*, key: str, limit: int, what: str, now: float | None = None) -> None:
    """Count one use of ``key`` in the current minute; RateLimited (429) past ``limit``. In the
    database so every web process shares the count; one conditional increment (or insert) per use,
    older minutes deleted as a new one starts. Hand-written: the limiting libraries keep counts in
    Django's cache, which is per process here."""
    now = time.time() if now is None else now
    minute = rate_minute(now)
    counts = PortalOpenCount.objects.filter(address=key[:64], minute=minute)
    if not counts.update(count=F("count") + 1):
        try:
            with transaction.atomic():
                PortalOpenCount.objects.filter(minute__lt=minute - 1).delete()
                PortalOpenCount.objects.create(address=key[:64], minute=minute, count=1)
        except IntegrityError:  # another process created this minute's row first
            counts.update(count=F("count") + 1)
    if counts.values_list("count", flat=True).first() > limit:
        raise RateLimited("rate_limited", f"too many {what}; try again shortly", retry_after=rate_retry_after(now))


def portal_open_rate_take(*, address: str, now: float | None = None) -> None:
    """Count one link opening from ``address``: at most ``BROKER_PORTAL_OPENS_PER_MINUTE`` a minute."""
    portal_rate_take(key=address, limit=int(settings.BROKER_PORTAL_OPENS_PER_MINUTE),
                     what="portal links opened from this address", now=now)


def portal_test_event_rate_take(*, consumer: Consumer) -> None:
    """Count one test event of ``consumer``: at most ``TEST_EVENTS_PER_MINUTE`` a minute, whoever
    sends them (each holds a web thread up to the probe's timeout)."""
    portal_rate_take(key=f"test-event:{consumer.pk}", limit=TEST_EVENTS_PER_MINUTE,
                     what="test events for this consumer")


def _state(row, *, link: PortalLink) -> str:
    """``active``, ``expired`` or ``revoked``, by the database's clock (``row.now``); a session
    ends with its link."""
    revoked = link.revoked_at or getattr(row, "revoked_at", None)
    return access_state(expires_at=link.expires_at, revoked_at=revoked, now=row.now)


def portal_link_find(*, token: str | None) -> PortalLink:
    """The open link ``token`` names (consumer and channel selected); PortalDenied when there is
    none (or its consumer is gone), it has expired or was revoked. Opens nothing."""
    link = None
    if token and len(token) <= TOKEN_MAX:
        link = (PortalLink.objects.select_related("consumer__channel").annotate(now=Now())
                .filter(token_hash=token_hash(token)).first())
    if link is None:
        raise PortalDenied("invalid")
    state = _state(link, link=link)
    if state != "active":
        raise PortalDenied(state)
    return link


def portal_link_check(*, token: str, address: str) -> PortalLink:
    """A link followed (a GET: a person, or a mail scanner or a chat's link preview): rate-limited
    per client address like an opening, and checked; no session is made (``portal_link_open`` makes
    one, on the person's button)."""
    portal_open_rate_take(address=address)
    return portal_link_find(token=token)


def portal_link_open(*, token: str, address: str) -> tuple[str, PortalLink]:
    """Open a link (rate-limited per client address): a new session scoped to the link's consumer.
    Returns the session's cookie value and the link (consumer and channel selected); PortalDenied
    when the link does not exist (or its consumer is gone), has expired or was revoked."""
    portal_open_rate_take(address=address)
    link = portal_link_find(token=token)
    key = token_new()
    PortalSession.objects.create(link=link, key_hash=token_hash(key), created_at=Now(), last_seen_at=Now())
    return key, link


def portal_session_find(*, key: str | None) -> PortalAccess:
    """The portal session a cookie value names, still open; PortalDenied otherwise (``idle`` when
    no request came for ``BROKER_PORTAL_IDLE``). Marks it seen (at most once a minute, or twice
    per idle time when that is shorter: one conditional UPDATE), so an idle end comes that late at
    most."""
    if not key or len(key) > TOKEN_MAX:
        raise PortalDenied("invalid")
    row = (PortalSession.objects.select_related("link__consumer__channel")
           .annotate(now=Now())
           .filter(key_hash=token_hash(key)).first())
    if row is None:
        raise PortalDenied("invalid")
    state = _state(row, link=row.link)
    if state != "active":
        raise PortalDenied(state)
    idle = settings.BROKER_PORTAL_IDLE
    if session_idle(last_seen_at=row.last_seen_at, now=row.now, idle=idle):
        raise PortalDenied("idle")
    PortalSession.objects.filter(pk=row.pk, last_seen_at__lt=Now() - seen_every(idle)).update(last_seen_at=Now())
    return PortalAccess(session=row, link=row.link, consumer=row.link.consumer)


def portal_session_end(*, access: PortalAccess) -> None:
    """Sign out: the session ends now (its link stays open: opening it again starts another)."""
    PortalSession.objects.filter(pk=access.session.pk, revoked_at__isnull=True).update(revoked_at=Now())


def portal_change_record(*, access: PortalAccess, action: str, **detail) -> None:
    """A change made in the portal, as an advisory naming the link (``type`` ``portal_<action>``):
    the operator sees it in the admin's advisories and on the link's page."""
    consumer = access.consumer
    advisory_record(type=f"portal_{action}", channel=consumer.channel.channel_id, consumer=consumer.consumer_id,
                    consumer_pk=consumer.pk, data={"link": access.link.pk, "link_created_by": access.link.created_by,
                                                   **detail})


def portal_changes(*, consumer_pk: int, link: PortalLink | None = None, types=None, limit: int = 20) -> list:
    """A consumer's advisories, newest first (``advisory_consumer``): those naming ``link`` (its
    portal changes, and the replays it started), or those of ``types``."""
    advisories = Advisory.objects.filter(consumer_pk=consumer_pk).order_by("-id")
    if link is not None:
        advisories = advisories.filter(Q(data__link=link.pk) | Q(data__source=link_label(link.pk)))
    if types is not None:
        advisories = advisories.filter(type__in=list(types))
    return list(advisories[:limit])
