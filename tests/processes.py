"""Start real broker processes (gunicorn web servers, qcluster workers) against the test database.

Use from tests marked ``django_db(transaction=True)`` so the child processes see committed rows.
qcluster can hang on SIGTERM (django-q2 issue #346): ``stop`` always SIGKILLs after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


from bench.common import http_ready
from bench.common import wait_for as bench_wait_for

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    """URL of the database the current test session uses (pytest-django's test_... database)."""
    from django.db import connection

    from broker.db.urls import database_url_render

    return database_url_render(connection.settings_dict)


def child_env(**extra) -> dict:
    from django.conf import settings

    env = dict(os.environ)
    env.update({
        "DATABASE_URL": test_database_url(),
        "DJANGO_SECRET_KEY": "test-secret-key-for-child-processes",
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "BROKER_ADMIN_TOKEN": settings.BROKER_ADMIN_TOKEN or "test-admin-token",
        "BROKER_TESTING": "0",
        "BROKER_SECURE_COOKIES": "0",
        "BROKER_CALLBACK_ALLOW": "127.0.0.1,::1,localhost",  # test receivers listen on loopback
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):
    """Poll ``predicate`` until it is true or ``timeout`` passes; its last value (no error)."""
    try:
        return bench_wait_for(predicate, timeout, "a condition", interval=interval)
    except RuntimeError:
        return predicate()


class Proc:
    def __init__(self, popen: subprocess.Popen, url: str | None = None, log: Path | None = None):
        self.popen = popen
        self.url = url
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self, sig=signal.SIGKILL) -> None:
        """Kill the whole process group (gunicorn/qcluster children too)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 5.0) -> None:
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""


def _spawn(args, env, log: Path) -> subprocess.Popen:
    fh = open(log, "wb")
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def start_web(tmp_path: Path, *, workers: int = 1, threads: int = 16, **env) -> Proc:
    """gunicorn as users run it (gunicorn.conf.py), on a free loopback port; waits until ready."""
    port = free_port()
    log = tmp_path / f"web-{port}.log"
    popen = _spawn([sys.executable, "-m", "gunicorn", "broker.wsgi:application"],
                   child_env(BROKER_BIND=f"127.0.0.1:{port}", BROKER_WEB_WORKERS=workers,
                             BROKER_WEB_THREADS=threads, **env), log)
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        http_ready(popen, proc.url, proc.output, timeout=30, name="gunicorn")
    except RuntimeError:
        proc.stop()
        raise
    return proc


def start_qcluster(tmp_path: Path, **env) -> Proc:
    """``python manage.py qcluster`` against the test database."""
    log = tmp_path / f"qcluster-{time.monotonic_ns()}.log"
    popen = _spawn([sys.executable, "manage.py", "qcluster"], child_env(**env), log)
    return Proc(popen, None, log)
