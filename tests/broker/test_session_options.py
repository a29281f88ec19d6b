"""jit = off on every session the broker opens (issue 21): JIT compilation of a short statement
costs more than running it, and is triggered by cost estimates, which are highest exactly when the
statistics are skewed. Set per session, never left to the server's configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from broker.db.listen import Listener, dedicated_connect

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def test_django_connections_run_without_jit():
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        assert cur.fetchone()[0] == "off"


def test_dedicated_connections_run_without_jit_under_their_own_name():
    with dedicated_connect(application_name="broker-test-dedicated") as conn:
        assert conn.execute("SHOW jit").fetchone()[0] == "off"
        assert conn.execute("SHOW application_name").fetchone()[0] == "broker-test-dedicated"
    listener = Listener(["broker_test_jit"], application_name="broker-test-listener")
    try:
        conn = listener.connect()
        assert conn is not None and conn.execute("SHOW jit").fetchone()[0] == "off"
    finally:
        listener.close()


def test_options_given_in_the_database_url_are_kept_and_jit_off_added():
    url = "postgres://u:p@db.invalid:5432/broker?options=-c%20statement_timeout%3D5000"
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['OPTIONS']['options'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "broker.settings",
                              "DJANGO_DEBUG": "1"}).stdout.strip().splitlines()[-1]
    assert out == "-c statement_timeout=5000 -c jit=off"
