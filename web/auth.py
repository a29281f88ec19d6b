"""Who a request is: the admin token header or a staff session, and the registry's rule. Every
comparison is constant-time (``broker.tokens``); tokens are never logged or echoed."""

from __future__ import annotations

from django.conf import settings

from broker.errors import Forbidden, Unauthenticated
from broker.tokens import tokens_equal

ADMIN_HEADER = "X-Broker-Admin-Token"


def is_admin(request) -> bool:
    """The admin token header, or a logged-in staff session."""
    given = request.headers.get(ADMIN_HEADER)
    if given is not None and tokens_equal(given, settings.BROKER_ADMIN_TOKEN):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


def require_admin(request) -> None:
    """401 without credentials, 403 with wrong ones."""
    if is_admin(request):
        return
    if request.headers.get(ADMIN_HEADER) is None:
        raise Unauthenticated("unauthorized", f"{ADMIN_HEADER} header is required")
    raise Forbidden("forbidden", "admin token does not match")


def registry_allowed(request) -> bool:
    """May this request use the registry (producers, channels, consumers; /dlq-status and
    /job-status)? The admin token or a staff session; with HMAC request signing on, a validly
    signed request too (webhook-broker's model: under ``[gateway-auth] mode=hmac`` the signature
    is the credential, so such a deployment switches without client changes); and anyone when
    ``BROKER_REGISTRY_AUTH=open`` (an authenticating gateway in front)."""
    if settings.BROKER_REGISTRY_AUTH == "open":
        return True
    if getattr(request, "broker_signed", False):  # set by web.middleware after verifying it
        return True
    return is_admin(request)


def require_registry(request) -> None:
    """As ``require_admin`` (401 without credentials, 403 with wrong ones), for the registry."""
    if not registry_allowed(request):
        require_admin(request)
