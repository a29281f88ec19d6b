"""Run the whole broker for a first try: migrate, seed, then gunicorn + django-q2 workers."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from broker import embedded_db

QCLUSTER_GRACE = 5.0  # django-q2's qcluster can hang on SIGTERM (its issue #346): SIGKILL after this


def _read_or_create(path: Path, make) -> str:
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


class Command(BaseCommand):
    help = "Migrate, seed samples, create the admin login, then run gunicorn (127.0.0.1:8080) and qcluster."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("BROKER_BIND", "127.0.0.1:8080"))
        parser.add_argument("--no-workers", action="store_true", help="do not start qcluster")

    def handle(self, *args, bind: str, no_workers: bool, **options):
        data = Path(settings.BROKER_DATA_DIR)
        call_command("migrate", interactive=False, verbosity=0)
        seed = settings.BROKER_SEED_CONFIG or str(Path(settings.BASE_DIR) / "broker.example.cfg")
        # The sample push consumer delivers to this broker's own /_sample-receiver on 127.0.0.1: allow
        # that address for callbacks unless the operator set an allow list (broker/netpolicy.py).
        settings.BROKER_CALLBACK_ALLOW = settings.BROKER_CALLBACK_ALLOW or "127.0.0.1"
        call_command("seed", config=seed)
        call_command("setup_schedules", verbosity=0)  # django-q2 schedules (jobs/management/commands)

        admin_token = settings.BROKER_ADMIN_TOKEN or _read_or_create(data / "admin_token",
                                                                       lambda: secrets.token_urlsafe(24))
        password = _read_or_create(data / "admin_password", lambda: secrets.token_urlsafe(12))

        User = get_user_model()
        user = User.objects.filter(username="admin").first()
        if user is None:
            User.objects.create_superuser("admin", "admin@localhost", password)
        env = {**os.environ, "BROKER_ADMIN_TOKEN": admin_token, "BROKER_BIND": bind,
               "DATABASE_URL": settings.DATABASE_URL, "BROKER_CALLBACK_ALLOW": settings.BROKER_CALLBACK_ALLOW}
        if seed:
            env["BROKER_SEED_CONFIG"] = seed
        self.stdout.write(self.style.SUCCESS(f"broker on http://{bind}/"))
        self.stdout.write(f"  admin site:  http://{bind}/admin/  login: admin / {password}")
        self.stdout.write(f"  admin token: {admin_token}   (header X-Broker-Admin-Token)")
        self.stdout.write(f"  API docs:    http://{bind}/api/docs/")
        self.stdout.write(f"  database:    {'embedded PostgreSQL under ' + str(data) if embedded_db.started() else 'DATABASE_URL'}")
        self.stdout.flush()

        # Each child gets its own process group, so stopping it also stops the processes it spawned
        # (qcluster's workers would otherwise outlive it).
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "broker.wsgi:application"],
                               cwd=settings.BASE_DIR, env=env, start_new_session=True)
        workers = None
        if not no_workers:
            workers = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=settings.BASE_DIR, env=env,
                                       start_new_session=True)
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping and web.poll() is None and (workers is None or workers.poll() is None):
                time.sleep(0.5)
        finally:
            procs = [p for p in (web, workers) if p is not None]
            for proc in procs:
                _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + QCLUSTER_GRACE
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _signal_group(proc, signal.SIGKILL)  # whatever is left of the group, qcluster's workers too
                proc.wait()
            self.stdout.write("broker stopped")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

