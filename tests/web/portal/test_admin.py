"""The portal in the operator's admin: links with who made them, when, their scope and state, the
sessions opened and the changes made with each (its advisories), and the revoke actions."""

from __future__ import annotations

import pytest
from django.test import Client

from web.portal.models import PortalLink, PortalSession
from tests.web.portal.conftest import link_make, link_open

pytestmark = pytest.mark.django_db


def test_links_sessions_and_changes_are_shown_and_revoked_in_the_admin(world, api, admin_client):
    body = link_make(api, scope="read")
    manage = link_make(api)
    team = Client()
    assert link_open(team, manage).status_code == 302
    assert team.post("/portal/channel/ch1/consumer/c1/endpoint/rotate-secret").status_code == 200
    link = PortalLink.objects.get(scope="manage")

    listing = admin_client.get("/admin/portal/portallink/").content.decode()
    assert "ch1 / c1" in listing and "admin token" in listing and "read" in listing and "active" in listing
    assert body["URL"].rsplit("/", 1)[1] not in listing
    page = admin_client.get(f"/admin/portal/portallink/{link.pk}/change/").content.decode()
    assert "portal_secret_rotated" in page and "grace_seconds=86400" in page  # the change made with it
    assert "Never opened." not in page  # its session

    r = admin_client.post("/admin/portal/portallink/", {"action": "revoke", "_selected_action": [link.pk]})
    assert r.status_code == 302
    assert PortalLink.objects.get(pk=link.pk).revoked_by == "staff user admin"
    assert team.get("/portal/channel/ch1/consumer/c1/").status_code == 403
    assert PortalLink.objects.get(scope="read").revoked_at is None
    assert "revoked" in admin_client.get("/admin/portal/portalsession/").content.decode()
    assert "portal_links_revoked" in admin_client.get("/admin/consumers/advisory/").content.decode()


def test_ending_one_session_leaves_the_link_open(world, api, admin_client):
    body = link_make(api)
    first, second = Client(), Client()
    assert link_open(first, body).status_code == 302 and link_open(second, body).status_code == 302
    session = PortalSession.objects.order_by("id").first()
    r = admin_client.post("/admin/portal/portalsession/", {"action": "revoke", "_selected_action": [session.pk]})
    assert r.status_code == 302
    assert first.get("/portal/channel/ch1/consumer/c1/").status_code == 403
    assert second.get("/portal/channel/ch1/consumer/c1/").status_code == 200
