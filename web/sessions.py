"""Database sessions that ignore malformed session cookies.

Django's keys are 32 lower-case letters and digits; a cookie with anything else (a NUL byte, say)
used to reach PostgreSQL and fail the request with a 500. Such a cookie now means "no session".
"""

from __future__ import annotations

from django.contrib.sessions.backends.db import SessionStore as DbSessionStore


class SessionStore(DbSessionStore):
    def _validate_session_key(self, key):
        return bool(key) and 8 <= len(key) <= 40 and key.isascii() and key.isalnum()
