"""``POST`` / ``DELETE /channel/{c}/consumer/{k}/portal-links``: an operator makes a link to one
consumer's portal for the team behind it, or ends every link and session of that consumer."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.times import rfc3339
from web.api.common import ADMIN_PARAM, ERROR, form_value, public_url
from web.api.consumers import consumer_for_admin
from web.api.put_schemas import put_request
from web.portal.links import portal_link_create, portal_links_revoke
from web.portal.rules import TTL_MAX, portal_scope_parse, portal_ttl_parse

# durations of at most 30d (a subset of what broker.durations reads: every value it allows is accepted)
TTL_PATTERN = (r"^([1-9][0-9]{0,5}s?|[1-9][0-9]{0,3}m|([1-9][0-9]?|[1-6][0-9]{2}|7[01][0-9]|720)h"
               r"|([1-9]|[12][0-9]|30)d|[1-4]w)$")
LINK_REQUEST = {
    "type": "object",
    "properties": {
        "ttl": {"description": "how long the link opens the portal (and its sessions last): a duration such as "
                               "90s, 15m, 12h, 7d or seconds; default 1h, at most 30d (else 400 invalid_ttl)",
                "anyOf": [{"type": "integer", "minimum": 1, "maximum": TTL_MAX},
                          {"type": "string", "pattern": TTL_PATTERN}]},
        "scope": {"type": "string", "enum": ["manage", "read"],
                  "description": "manage (default): everything, with the endpoint form, requeues and replay; "
                                 "read: everything, no forms"},
    },
}


class PortalLinkSerializer(serializers.Serializer):
    """The 201 answer (OpenAPI component ``PortalLink``)."""

    URL = serializers.URLField(help_text="open it in a browser: a portal session scoped to this consumer")
    ExpiresAt = serializers.DateTimeField(help_text="RFC 3339; the link and its sessions end then")
    Scope = serializers.ChoiceField(choices=["manage", "read"])


def link_url(request, token: str) -> str:
    """The link: on the broker's public address (BROKER_PUBLIC_URL, or its earlier name
    BROKER_PORTAL_URL) when set, else on the scheme and host this request came to."""
    path = f"/portal/open/{token}"
    return public_url(request, path)


def made_by(request) -> str:
    """Who is making or revoking a link, for the admin: a staff user's name, else the admin token."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"staff user {user.get_username()}"
    return "admin token"


class PortalLinksView(APIView):
    @extend_schema(
        summary="Make a link to the consumer's delivery portal (admin token or staff session)",
        description="Form fields or JSON: ttl (duration, default 1h, at most 30d), scope (manage | read). The URL "
                    "opens, in a browser, a portal session scoped to this one consumer: its deliveries, dead "
                    "letters, replay and (push, manage scope) its endpoint. The token in the URL is stored only "
                    "as a hash: this answer is the only place it appears.",
        parameters=[ADMIN_PARAM], request=put_request(LINK_REQUEST),
        responses={201: PortalLinkSerializer, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 415: ERROR},
    )
    def post(self, request, channel_id: str, consumer_id: str):
        consumer = consumer_for_admin(request, channel_id, consumer_id)
        ttl = portal_ttl_parse(form_value(request, "ttl"))
        scope = portal_scope_parse(form_value(request, "scope"))
        link, token = portal_link_create(consumer=consumer, ttl_seconds=ttl, scope=scope, created_by=made_by(request))
        response = Response({"URL": link_url(request, token), "ExpiresAt": rfc3339(link.expires_at),
                             "Scope": link.scope}, status=201)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(
        summary="Revoke every portal link and session of the consumer at once (admin token or staff session)",
        parameters=[ADMIN_PARAM], request=None,
        responses={204: OpenApiResponse(description="revoked (also when there was none)"), 401: ERROR, 403: ERROR,
                   404: ERROR},
    )
    def delete(self, request, channel_id: str, consumer_id: str):
        consumer = consumer_for_admin(request, channel_id, consumer_id)
        portal_links_revoke(consumer=consumer, by=made_by(request))
        return Response(status=204)
