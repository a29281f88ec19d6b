"""Portal fixtures: links made through the API (as an operator makes them) and their paths."""

from __future__ import annotations

from urllib.parse import urlsplit

# the push fixtures (a real receiver on 127.0.0.1, in-process dispatcher loops) and the admin e2e
# tests' Chromium launch settings and artifacts folder
from tests.jobs.conftest import dispatcher, push_settings, receiver  # noqa: F401
from tests.web.admin.conftest import artifacts, browser_type_launch_args  # noqa: F401

C1 = "/channel/ch1/consumer/c1"


def link_make(api, consumer: str = C1, **data) -> dict:
    """POST .../portal-links with the admin token; the 201 body."""
    r = api.post(f"{consumer}/portal-links", data, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def link_path(body: dict) -> str:
    """The link's path (the test servers' host differs from the one the API saw)."""
    return urlsplit(body["URL"]).path



def link_open(client, body: dict):
    """What a person does with a link: follow it (GET: checked, no session, on to /portal/open),
    then press "Open the portal" (POST: the session); the POST's answer (302 to the overview)."""
    followed = client.get(link_path(body))
    assert followed.status_code == 302 and followed["Location"] == "/portal/open", followed.content
    return client.post("/portal/open")
