"""Secure defaults: production settings (imported in a clean subprocess with a controlled
environment) and credentials on the admin site and every admin-token endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from tests.processes import ROOT

PROBE = """
import json
from django.conf import settings
import django
django.setup()
print(json.dumps({k: getattr(settings, k) for k in (
    "DEBUG", "ALLOWED_HOSTS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY",
    "X_FRAME_OPTIONS", "MIDDLEWARE", "BROKER_CALLBACK_DENY_PRIVATE", "BROKER_ADMIN_TOKEN")}))
"""


def settings_in_subprocess(tmp_path, **env) -> subprocess.CompletedProcess:
    """Import broker.settings in a fresh interpreter: no pytest loaded, only the given variables."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("DJANGO_", "BROKER_", "PYTEST")) and k != "DATABASE_URL"}
    clean.update({"DJANGO_SETTINGS_MODULE": "broker.settings", "BROKER_DATA_DIR": str(tmp_path),
                  # never connected to at import; keeps the probe from starting an embedded server
                  "DATABASE_URL": "postgres://nobody:nothing@127.0.0.1:1/none"})
    clean.update(env)
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=60)


def test_production_settings_require_a_secret_key(tmp_path):
    result = settings_in_subprocess(tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr


def test_production_defaults_are_secure(tmp_path):
    result = settings_in_subprocess(tmp_path, DJANGO_SECRET_KEY="k" * 50)
    assert result.returncode == 0, result.stderr
    s = json.loads(result.stdout.strip().splitlines()[-1])
    assert s["DEBUG"] is False
    assert "*" not in s["ALLOWED_HOSTS"] and s["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost"]
    assert s["SESSION_COOKIE_SECURE"] is True and s["CSRF_COOKIE_SECURE"] is True
    assert s["SESSION_COOKIE_HTTPONLY"] is True and s["X_FRAME_OPTIONS"] == "DENY"
    assert "django.middleware.csrf.CsrfViewMiddleware" in s["MIDDLEWARE"]
    assert "django.middleware.security.SecurityMiddleware" in s["MIDDLEWARE"]
    assert s["BROKER_CALLBACK_DENY_PRIVATE"] is True
    assert s["BROKER_ADMIN_TOKEN"] == ""  # no default admin token: admin endpoints stay closed


def test_debug_relaxes_only_for_development(tmp_path):
    result = settings_in_subprocess(tmp_path, DJANGO_DEBUG="1")
    assert result.returncode == 0, result.stderr
    s = json.loads(result.stdout.strip().splitlines()[-1])
    assert s["DEBUG"] is True and s["SESSION_COOKIE_SECURE"] is False
    assert s["BROKER_CALLBACK_DENY_PRIVATE"] is False
    result = settings_in_subprocess(tmp_path, DJANGO_DEBUG="1", BROKER_CALLBACK_DENY_PRIVATE="1")
    assert json.loads(result.stdout.strip().splitlines()[-1])["BROKER_CALLBACK_DENY_PRIVATE"] is True


ADMIN_ENDPOINTS = [
    ("get", "/producers"), ("get", "/channels"), ("get", "/producer/p1"), ("put", "/producer/p9"),
    ("get", "/channel/ch1"), ("put", "/channel/ch9"), ("get", "/channel/ch1/consumers"),
    ("put", "/channel/ch1/consumer/c9"), ("delete", "/channel/ch1/consumer/c1"),
    ("post", "/channel/ch1/consumer/c1/pause"), ("post", "/channel/ch1/consumer/c1/resume"),
    ("post", "/channel/ch1/consumer/c1/rotate-secret"), ("get", "/dlq-status"), ("get", "/job-status"),
]


@pytest.mark.django_db
def test_admin_token_endpoints_need_credentials(world, settings):
    client = APIClient()
    for method, path in ADMIN_ENDPOINTS:
        r = getattr(client, method)(path)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (method, path, r.status_code)
        r = getattr(client, method)(path, HTTP_X_BROKER_ADMIN_TOKEN="not-the-token")
        assert r.status_code == 403 and r.json()["error"] == "forbidden", (method, path, r.status_code)
    # without a configured admin token, no header value (not even an empty one) is the admin
    settings.BROKER_ADMIN_TOKEN = ""
    for value in ("", " "):
        r = client.get("/producers", HTTP_X_BROKER_ADMIN_TOKEN=value)
        assert r.status_code in (401, 403), r.status_code
    # a non-staff session is no admin either
    user = User.objects.create_user("someone", password="pw-someone-1")
    client.force_login(user)
    assert client.get("/producers").status_code == 401


@pytest.mark.django_db
def test_admin_site_needs_a_staff_login_and_csrf(world):
    anonymous = Client(enforce_csrf_checks=True)
    r = anonymous.get("/admin/")
    assert r.status_code == 302 and "/admin/login/" in r["Location"]
    for path in ("/admin/consumers/consumer/", "/admin/jobs/job/", "/admin/broker/channel/"):
        r = anonymous.get(path)
        assert r.status_code == 302 and "/admin/login/" in r["Location"], path
    User.objects.create_user("staff", password="pw-staff-1", is_staff=True, is_superuser=True)
    # the login form itself is CSRF-protected
    assert anonymous.post("/admin/login/", {"username": "staff", "password": "pw-staff-1"}).status_code == 403
    # a staff session may use the API (as the admin) but its writes need the CSRF token
    staff = APIClient(enforce_csrf_checks=True)
    staff.login(username="staff", password="pw-staff-1")
    assert staff.get("/producers").status_code == 200
    r = staff.put("/channel/ch9", {"token": "t"})
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
