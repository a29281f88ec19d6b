"""gunicorn settings (read from the working directory): ``gunicorn broker.wsgi:application``.

Threaded workers (gthread): a long-polling pull holds its thread for up to 60 s without a
database connection, while the other threads keep serving, so long polls never starve
other requests. Tune with BROKER_WEB_WORKERS / BROKER_WEB_THREADS / BROKER_BIND.
"""

import os

bind = os.environ.get("BROKER_BIND", "127.0.0.1:8080")
workers = int(os.environ.get("BROKER_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("BROKER_WEB_THREADS", "32"))
timeout = 120  # > the 60 s long-poll maximum
graceful_timeout = 30
keepalive = 75
max_requests = int(os.environ.get("BROKER_WEB_MAX_REQUESTS", "0"))
accesslog = os.environ.get("BROKER_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("BROKER_LOG_LEVEL", "info").lower()
proc_name = "broker-web"


def on_starting(server):
    """Apply BROKER_SEED_CONFIG once, in the master, before workers start."""
    seed = os.environ.get("BROKER_SEED_CONFIG")
    if seed:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
        import django

        django.setup()
        from broker.services.seed import seed_from_file

        seed_from_file(seed)
