"""Portal fixtures: links made through the API (as an operator makes them) and opened by a client."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.conftest import ADMIN_TOKEN

C1 = "/channel/ch1/consumer/c1"


def link_make(api, consumer: str = C1, **data) -> dict:
    """POST .../portal-links with the admin token; the 201 body."""
    r = api.post(f"{consumer}/portal-links", data, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def link_path(body: dict) -> str:
    """The link's path (the test servers' host differs from the one the API saw)."""
    return urlsplit(body["URL"]).path


@pytest.fixture
def portal_link(api):
    return lambda consumer=C1, **data: link_make(api, consumer, **data)


__all__ = ["ADMIN_TOKEN", "C1", "link_make", "link_path"]
