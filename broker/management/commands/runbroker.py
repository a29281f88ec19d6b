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

GRACE = 10.0  # seconds the children get to stop after Ctrl-C, then SIGKILL for whatever is left


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
        env.setdefault("BROKER_LOG_FORMAT", "plain")  # one console format for web and workers (broker.logs)
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
            self._stop(web, workers)

    def _stop(self, web: subprocess.Popen, workers: subprocess.Popen | None) -> None:
        """gunicorn: SIGTERM to its group (it finishes the requests it serves). qcluster: SIGTERM to
        its main process only, django-q2's own stop sequence, in which the dispatcher loops hand
        over and end (jobs/tasks.py); a SIGTERM to its whole group would leave its main process
        hanging (django-q2 #346). Whatever is still running after ``GRACE`` gets SIGKILL. The last
        line says what is left: the embedded PostgreSQL, shared with other commands, keeps running."""
        _signal_group(web, signal.SIGTERM)
        if workers is not None and workers.poll() is None:
            workers.send_signal(signal.SIGTERM)
        procs = [p for p in (web, workers) if p is not None]
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and any(_group_alive(p) for p in procs):
            time.sleep(0.1)
        killed = [p for p in procs if _group_alive(p)]
        for proc in killed:
            _signal_group(proc, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        note = f" ({len(killed)} process group(s) killed after {GRACE:g} s)" if killed else ""
        server = embedded_db.started()
        if server is None:
            self.stdout.write(f"broker stopped{note}")
        else:
            self.stdout.write(f"broker stopped{note}; the embedded PostgreSQL keeps running ({server.data_dir}); "
                              f"stop it with: {sys.executable} -m broker.embedded_db stop")
        self.stdout.flush()


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether any process of ``proc``'s group (its own session) is still running; reaps ``proc``."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if proc.returncode is None:
        return True
    return any(_pgid_of(pid) == proc.pid for pid in os.listdir("/proc") if pid.isdigit())


def _pgid_of(pid: str) -> int | None:
    """The process group of a running (not zombie) process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

