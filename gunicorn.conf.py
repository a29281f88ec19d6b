"""gunicorn settings (read from the working directory): ``gunicorn broker.wsgi:application``.

gunicorn's master with the broker's own worker class (``web.server.worker.BrokerWorker``): an
HTTP/1.1 server on an event loop (uvloop, httptools) that answers the single publish on the loop
and runs every other request through Django in a pool of BROKER_WEB_THREADS threads. A
long-polling pull holds its thread for up to 60 s without a database connection, while the other
threads keep serving, so long polls never starve other requests. Tune with BROKER_WEB_WORKERS /
BROKER_WEB_THREADS / BROKER_BIND; BROKER_WEB_WORKER_CLASS=gthread runs gunicorn's own threaded
worker instead (no native routes).
"""

import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the repository root, for broker/
from broker.db.urls import DatabaseUrlError, database_url_parse  # noqa: E402  (no Django: safe before it loads)
from broker.embedded_db import database_url_ensure  # noqa: E402
from broker.logs import log_format_default, logging_config  # noqa: E402  (stdlib only)
from gunicorn.glogging import Logger  # noqa: E402

# A serving process (broker.settings: the database bounds are on), also when on_starting below loads
# Django in the master before broker.wsgi (BROKER_SEED_CONFIG): the workers inherit its settings.
os.environ.setdefault("BROKER_SERVING", "1")

if os.environ.get("DATABASE_URL"):
    try:
        database_url_parse(os.environ["DATABASE_URL"])
    except DatabaseUrlError as _exc:  # one line naming the refused part, before any worker starts
        sys.exit(str(_exc))

bind = os.environ.get("BROKER_BIND", "127.0.0.1:8080")
# One process by default (two until 2026-11-30): a process's single publishes share its publishing
# thread's commits (jobs.publish.grouped), and two processes split them into twice the batches. At
# 1,000/s on 2 cores one process cost 0.54 ms of CPU per message for the whole broker against 0.69
# with two (PostgreSQL 0.28 against 0.35, web 0.17 against 0.24; bench/capacity.py, README "Headroom").
# Its 64 threads keep the long polls two processes of 32 held. More cores: more workers.
workers = int(os.environ.get("BROKER_WEB_WORKERS", "1"))
worker_class = os.environ.get("BROKER_WEB_WORKER_CLASS") or "web.server.worker.BrokerWorker"
threads = int(os.environ.get("BROKER_WEB_THREADS", "64"))
timeout = 120  # > the 60 s long-poll maximum
graceful_timeout = 30
keepalive = 75
max_requests = int(os.environ.get("BROKER_WEB_MAX_REQUESTS", "0"))
accesslog = os.environ.get("BROKER_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("BROKER_LOG_LEVEL", "info").lower()
# gunicorn's own lines go through the broker's logging configuration (broker.logs): one format on a
# console, plain for `make run`, JSON in production (BROKER_LOG_FORMAT).
logconfig_dict = logging_config(fmt=log_format_default(os.environ), level=loglevel.upper())


class BrokerLogger(Logger):
    """gunicorn's logger, configured by ``logconfig_dict``; the access log stays off unless
    BROKER_ACCESS_LOG asks for it (gunicorn turns it on with any logging configuration, and then
    formats a line for every request, the hot pull routes included)."""

    def _compute_access_log_enabled(self):
        return bool(self.cfg.accesslog)


logger_class = BrokerLogger
proc_name = "broker-web"


def _control_socket() -> str | None:
    """gunicorn (25.1+) opens a control socket for ``gunicornc``, by default one path per user
    ($XDG_RUNTIME_DIR or ~/.gunicorn/gunicorn.ctl), so two brokers on one host delete each
    other's. Each instance gets its own, named for its bind address, under BROKER_DATA_DIR;
    BROKER_GUNICORN_CONTROL_SOCKET sets another path, or "off" turns it off (None)."""
    value = os.environ.get("BROKER_GUNICORN_CONTROL_SOCKET", "").strip()
    if value.lower() in ("off", "none", "false", "0"):
        return None
    if value:
        return value
    data = os.environ.get("BROKER_DATA_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".data")
    name = re.sub(r"[^A-Za-z0-9.]+", "-", bind).strip("-")
    path = os.path.join(os.path.abspath(data), "run", f"gunicorn-{name}.ctl")
    if len(path.encode()) > 100:  # AF_UNIX paths end at 107 bytes: a shorter, hashed name
        path = os.path.join(os.path.abspath(data), "run", f"gunicorn-{hashlib.sha1(bind.encode()).hexdigest()[:12]}.ctl")
    return path if len(path.encode()) <= 100 else None


_CONTROL_SOCKET = _control_socket()
if _CONTROL_SOCKET:
    control_socket = _CONTROL_SOCKET
else:
    control_socket_disable = True


def on_starting(server):
    """In the master, before workers start: start the embedded PostgreSQL when DATABASE_URL is unset
    (workers inherit the exported URL), then apply BROKER_SEED_CONFIG once."""
    database_url_ensure()
    seed = os.environ.get("BROKER_SEED_CONFIG")
    if seed:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
        import django

        django.setup()
        from consumers.seed import seed_from_file

        seed_from_file(seed)
