"""Settings, all from the environment (see README "Configuration" for every variable).

Importing this module reads the environment (and the INI seed file it names) and nothing else: it
never writes ``os.environ`` and never starts a server. ``DATABASE_URL`` selects PostgreSQL (the
only engine); when a user leaves it unset, the entry point (manage.py, broker/wsgi.py,
gunicorn.conf.py, the test session) has started the embedded server and set it before Django
loads (broker/embedded_db.py ``database_url_ensure``).
"""

from __future__ import annotations

import configparser
import os
import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from broker.db.urls import DatabaseUrlError, django_database, options_settings
from broker.durations import duration_parse
from broker.embedded_db import data_dir
from broker.logs import logging_config
from broker.tracing import otel_configured

BASE_DIR = Path(__file__).resolve().parent.parent
TESTING = "pytest" in sys.modules or os.environ.get("BROKER_TESTING") == "1"
# The environment, with the INI seed file's broker keys beneath it (filled in below); read, never
# written back to os.environ (child processes read the same file themselves).
_ENV: dict[str, str] = dict(os.environ)


def env_str(name: str, default: str = "") -> str:
    return _ENV.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = _ENV.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {value!r}")


def _env_number(name: str, default, cast, kind: str):
    """``cast`` of the variable, ``default`` when unset or empty; anything else fails at start-up."""
    value = _ENV.get(name)
    if value is None or value == "":
        return default
    try:
        return cast(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be {kind}, got {value!r}") from exc


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


def env_int(name: str, default: int | None) -> int | None:
    return _env_number(name, default, int, "an integer")


def env_duration(name: str, default: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d`` or seconds (``broker.durations``), at least one second."""
    seconds = _env_number(name, duration_parse(default), duration_parse, "a duration such as 90s, 15m, 7d")
    if seconds < 1:
        raise ImproperlyConfigured(f"{name} must be at least one second, got {_ENV.get(name)!r}")
    return timedelta(seconds=seconds)


# The webhook-broker INI file may also carry broker settings ([broker], [consumer-connection]);
# environment variables win over it.
BROKER_SEED_CONFIG = env_str("BROKER_SEED_CONFIG")
_INI_KEYS = {
    "BROKER_CONNECTION_TIMEOUT": ("consumer-connection", "connection-timeout-in-seconds"),
    "BROKER_CONSUMER_TOKEN_HEADER": ("consumer-connection", "token-header-name"),
    "BROKER_USER_AGENT": ("consumer-connection", "user-agent"),
    "BROKER_RATIONAL_DELAY": ("broker", "rational-delay-in-seconds"),
    "BROKER_RETRY_BACKOFF": ("broker", "retry-backoff-delays-in-seconds"),
    "BROKER_MAX_RETRY": ("broker", "max-retry"),
}
if BROKER_SEED_CONFIG and os.path.exists(BROKER_SEED_CONFIG):
    _ini = configparser.ConfigParser(interpolation=None, strict=False)
    _ini.optionxform = str  # keep key case
    try:
        _ini.read(BROKER_SEED_CONFIG)
    except configparser.Error:
        _ini = None
    if _ini is not None:
        if _ini.has_section("gateway-auth") and _ini.get("gateway-auth", "mode", fallback="none").strip() == "hmac":
            _INI_KEYS.update({
                "BROKER_HMAC_SECRET": ("gateway-auth", "hmac-shared-secret"),
                "BROKER_HMAC_TOLERANCE": ("gateway-auth", "hmac-timestamp-tolerance-seconds"),
                "BROKER_HMAC_EXEMPT_PATHS": ("gateway-auth", "auth-exempt-paths"),
            })
        for _name, (_section, _key) in _INI_KEYS.items():
            if _name not in _ENV and _ini.has_option(_section, _key):
                _value = _ini.get(_section, _key).strip()
                if _value:
                    _ENV[_name] = _value
        # webhook-broker's retention key, in whole days (consumers.seed reports a bad value)
        _days = _ini.get("prune", "message-retention-days", fallback="").strip()
        if "BROKER_RETENTION" not in _ENV and _days.isdigit() and int(_days) > 0:
            _ENV["BROKER_RETENTION"] = f"{int(_days)}d"

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if DEBUG or TESTING:
        SECRET_KEY = "insecure-development-key-do-not-use-in-production"
    else:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required when DJANGO_DEBUG is off")
ALLOWED_HOSTS = [h.strip() for h in env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
if TESTING:
    ALLOWED_HOSTS += ["testserver"]

BROKER_DATA_DIR = data_dir()
# Server-side prepared statements on the hot paths (off behind poolers that cannot keep them).
BROKER_PREPARED_STATEMENTS = env_bool("BROKER_PREPARED_STATEMENTS", True)
# The spec path's job state changes commit without waiting for the WAL flush (jobs.pull.spec.job_move_spec).
BROKER_PULL_ASYNC_COMMIT = env_bool("BROKER_PULL_ASYNC_COMMIT", True)
# The hot routes (the single publish, the pull routes) skip URL resolving, DRF and the middleware
# chain (web.api.fast_lane.FastLaneMiddleware); BROKER_PULL_FAST_LANE is its earlier name.
BROKER_FAST_LANE = env_bool("BROKER_FAST_LANE", env_bool("BROKER_PULL_FAST_LANE", True))
# The routes the web server (web/server, gunicorn.conf.py's worker) answers on its event loop, the
# single publish first; with the fast lane off, none: every request goes through Django.
BROKER_NATIVE_ROUTES = "web.server.native.native_routes" if BROKER_FAST_LANE else ""
# A web worker, once loaded, and a qcluster worker as it spawns move what they keep for their life out
# of the garbage collector's full passes (broker.heap): each walked ~150,000 objects and stalled a web
# worker's event loop up to 0.35 s.
BROKER_GC_FREEZE = env_bool("BROKER_GC_FREEZE", True)

# --- database -----------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if not DATABASE_URL:
    raise ImproperlyConfigured(
        "DATABASE_URL is not set: set it, or start the broker through manage.py, broker.wsgi or "
        "gunicorn.conf.py, which start the embedded PostgreSQL (broker.embedded_db.database_url_ensure)")

# libpq's URI, multi-host included (postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write),
# with any libpq parameter in the query string and broker.db.urls.LIBPQ_DEFAULTS beneath them
# (connect_timeout, TCP keepalives, tcp_user_timeout): every connection the broker opens uses them.
# A URL it cannot use stops the start with one line naming the part (broker.db.urls.DatabaseUrlError).
try:
    _DATABASE = django_database(DATABASE_URL)
except DatabaseUrlError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# ENGINE broker.db.backend: Django's PostgreSQL backend whose connections bound every round trip
# (BROKER_DB_TIMEOUT below).
_DATABASE.update(
    CONN_MAX_AGE=env_int("BROKER_DB_CONN_MAX_AGE", 300),
    # No per-request "SELECT 1": a connection broken by a database restart fails one request
    # with 503 and is then replaced (Django drops unusable connections after errors).
    CONN_HEALTH_CHECKS=env_bool("BROKER_DB_HEALTH_CHECKS", False),
)
DATABASES = {"default": _DATABASE}


def _application_name(argv: list[str]) -> str:
    """What pg_stat_activity shows for this process's sessions: the program, and a manage.py
    command's name ("manage.py qcluster"; "gunicorn" for ``python -m gunicorn``), so that an operator
    (and bench/capacity.py's CPU by process) tells the web tier from the workers."""
    program = os.path.basename(argv[0]) if argv and argv[0] else "broker"
    if program == "__main__.py":
        program = os.path.basename(os.path.dirname(argv[0])) or "broker"
    if program == "manage.py" and len(argv) > 1:
        program += " " + argv[1]
    return program[:60]


DATABASES["default"]["OPTIONS"].setdefault("application_name", _application_name(sys.argv))
# jit = off on every session the broker opens (Django's connections, the dedicated LISTEN ones, the
# django-q2 cluster; the Spark pipeline's JDBC URL carries the same option). The broker runs short
# OLTP statements: JIT compilation of one costs tens to hundreds of milliseconds (measured: 340 ms of
# a 291 ms generic-plan queued-jobs list was compilation) and saves nothing, and it is triggered by
# cost estimates, which are highest exactly when the statistics are skewed. PostgreSQL turns JIT on
# by default and an operator may not change the server, so it is a startup option of the session;
# a libpq ``options`` given in DATABASE_URL's query string is kept, jit=off appended after it.
SESSION_OPTIONS = "-c jit=off"
DATABASES["default"]["OPTIONS"]["options"] = " ".join(
    x for x in (DATABASES["default"]["OPTIONS"].get("options", ""), SESSION_OPTIONS) if x)
# Every database round trip of the web processes and the workers is bounded (docs/high-availability.md):
# the server cancels a statement (lock waits included) after BROKER_DB_TIMEOUT seconds
# (statement_timeout), ends a session left idle inside a transaction after three times that
# (idle_in_transaction_session_timeout: a client lost mid-transaction must not hold its locks), and
# the client gives up on a round trip that got no answer DB_TIMEOUT_GRACE seconds later (a silent
# link or server: broker.db.backend.BoundedConnection), closing the connection. On by default in the
# serving processes only (a WSGI server that loaded broker.wsgi, and qcluster): migrations, operator
# commands, benchmarks and tests may run long statements. A URL whose ``options`` sets one of these
# settings keeps its own value. gunicorn.conf.py sets BROKER_SERVING=1: its master loads Django before
# broker.wsgi when it applies BROKER_SEED_CONFIG, and the workers it forks keep those settings.
_SERVING = os.environ.get("BROKER_SERVING") == "1" or "broker.wsgi" in sys.modules or (
    os.path.basename(sys.argv[0] or "") == "manage.py" and sys.argv[1:2] == ["qcluster"])
BROKER_DB_TIMEOUT = env_float("BROKER_DB_TIMEOUT", 10.0 if _SERVING and not TESTING else 0.0)
DB_TIMEOUT_GRACE = 2.0
BROKER_DB_SESSION_SETTINGS = {
    name: value for name, value in (
        ("statement_timeout", f"{int(BROKER_DB_TIMEOUT * 1000)}ms"),
        ("idle_in_transaction_session_timeout", f"{int(BROKER_DB_TIMEOUT * 3000)}ms"),
    ) if BROKER_DB_TIMEOUT > 0 and name not in options_settings(DATABASES["default"]["OPTIONS"]["options"])
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- apps ---------------------------------------------------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "broker",
    "eventtypes",  # event types with schemas (issue 37): between consumers and broker
    "consumers",
    "jobs",
    "pipeline",
    "sources",  # inbound sources (issue 36): provider webhooks verified, deduplicated, published
    "web",
    "web.portal",  # the delivery portal (issue 29): its own app label, tables and migrations
]

MIDDLEWARE = [
    "web.api.fast_lane.FastLaneMiddleware",  # first: the hot routes skip the rest (see its docstring)
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "web.middleware.HmacSignatureMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "web.urls"
WSGI_APPLICATION = "broker.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("BROKER_STATIC_ROOT", str(BROKER_DATA_DIR / "static")))  # made by broker.apps
# Admin and API-docs assets are served by WhiteNoise straight from the installed apps (no
# collectstatic step, no CDN: the network may be closed).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

SESSION_COOKIE_HTTPONLY = True
SESSION_ENGINE = "web.sessions"  # malformed session cookies are ignored, not a 500
SESSION_COOKIE_SECURE = not DEBUG and not TESTING and env_bool("BROKER_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"

DATA_UPLOAD_MAX_MEMORY_SIZE = None  # the broadcast view enforces BROKER_MAX_PAYLOAD_BYTES itself
DATA_UPLOAD_MAX_NUMBER_FIELDS = 10000

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # Only a staff session authenticates (and then CSRF applies to its writes); API clients use
    # the broker's per-object tokens, checked in the views.
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "EXCEPTION_HANDLER": "web.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Message and webhook broker API",
    "DESCRIPTION": "Channels, producers, push and pull consumers, jobs. Compatible with webhook-broker.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "web.api.errors.schema_common_responses",
                             "web.api.put_schemas.schema_links",  # issue 25: PUT links, ConsumerFilter  # 503 (and HMAC 401/403) everywhere
                             "web.api.request_bodies.schema_bodies_required",  # issue 29: bodies a route needs
                             "web.api.event_types.schema_webhooks"],  # issue 37: the event types as webhooks
    # OpenAPI 3.1 (issue 37): JSON Schema 2020-12 (propertyNames, type lists for null) and webhooks
    "OAS_VERSION": "3.1.0",
}

# --- broker settings ---------------------------------------------------------------------------
BROKER_ADMIN_TOKEN = env_str("BROKER_ADMIN_TOKEN")
BROKER_MAX_PAYLOAD_BYTES = env_int("BROKER_MAX_PAYLOAD_BYTES", 5 * 1024 * 1024)
BROKER_MAX_BATCH_MESSAGES = 1000
BROKER_CONNECTION_TIMEOUT = env_float("BROKER_CONNECTION_TIMEOUT", 30.0)
BROKER_RATIONAL_DELAY = env_float("BROKER_RATIONAL_DELAY", 2.0)
BROKER_RETRY_BACKOFF = [
    float(x) for x in env_str("BROKER_RETRY_BACKOFF", "5,30,60").split(",") if x.strip()
] or [5.0, 30.0, 60.0]
BROKER_MAX_RETRY = env_int("BROKER_MAX_RETRY", 5)
BROKER_CONSUMER_TOKEN_HEADER = env_str("BROKER_CONSUMER_TOKEN_HEADER", "X-Broker-Consumer-Token")
BROKER_USER_AGENT = env_str("BROKER_USER_AGENT", "Webhook Message Broker")
BROKER_MIN_SCHEDULE_DELAY = env_float("BROKER_MIN_SCHEDULE_DELAY", 120.0)
BROKER_ADVISORY_CHANNEL = env_str("BROKER_ADVISORY_CHANNEL")
# Partitions: a push worker's lease on a partition (database time), renewed every third of it.
BROKER_PARTITION_LEASE_SECONDS = env_float("BROKER_PARTITION_LEASE_SECONDS", 10.0)
# Doorbell (pull consumers with a callbackUrl): safety-net check period (<= 0 disables), POST timeout.
BROKER_DOORBELL_POLL = env_float("BROKER_DOORBELL_POLL", 1.0)
BROKER_DOORBELL_TIMEOUT = env_float("BROKER_DOORBELL_TIMEOUT", 2.0)
# Optional HMAC signing of incoming requests (webhook-broker's [gateway-auth] mode=hmac).
BROKER_HMAC_SECRET = env_str("BROKER_HMAC_SECRET")
BROKER_HMAC_TOLERANCE = env_float("BROKER_HMAC_TOLERANCE", 300.0)
BROKER_HMAC_EXEMPT_PATHS = [p.strip() for p in env_str(
    "BROKER_HMAC_EXEMPT_PATHS", "/_status,/metrics,/admin/,/static/,/api/schema/,/api/docs/,/api/redoc/,/portal/,/in/"
).split(",") if p.strip()]
# Who may use the registry (producers, channels, consumers; /dlq-status, /job-status): "token" = the
# admin token, a staff session, or with BROKER_HMAC_SECRET a validly signed request (webhook-broker's
# gateway model); "open" = anyone, for deployments behind an authenticating gateway (web.auth).
BROKER_REGISTRY_AUTH = env_str("BROKER_REGISTRY_AUTH", "token").strip().lower() or "token"
if BROKER_REGISTRY_AUTH not in ("token", "open"):
    raise ImproperlyConfigured(f"BROKER_REGISTRY_AUTH must be token or open, got {BROKER_REGISTRY_AUTH!r}")

# --- django-q2 ----------------------------------------------------------------------------------
Q_CLUSTER = {
    "name": env_str("BROKER_Q_CLUSTER_NAME", "broker"),
    "orm": "default",
    "workers": env_int("BROKER_Q_WORKERS", 3),
    # A push dispatcher loop (jobs.push.dispatcher) runs as one long task: it claims for
    # BROKER_PUSH_LOOP_SECONDS, then drains its in-flight callbacks; timeout bounds both and
    # stays below retry so the ORM broker never hands a running task out twice.
    "timeout": 150,
    "retry": 180,
    "max_attempts": 1,
    "catch_up": False,
    # An idle broker's own cost (issue 28): an enqueue NOTIFYs the queue's reader, which reads an
    # empty queue every 5 s (broker.task_queue) and returns every poll without a statement (the
    # pusher sees a stop between reads; poll is the read's pace while its LISTEN connection is
    # down), and the sentinel's guard (worker health, the minute's schedules, its status record)
    # runs every 2 s instead of django-q2's 0.2 and 0.5 s.
    "poll": env_float("BROKER_Q_POLL", 0.5),
    "guard_cycle": 2.0,
    "save_limit": 100,
    "ack_failures": True,
    # the queue in PostgreSQL, riding out cut connections and failovers (broker/task_queue.py)
    "broker_class": "broker.task_queue.OrmQueue",
}
# Beyond one machine (docs/multi-node.md): django-q2's task queue on Redis instead of the
# database (needs the ``redis`` package). Tasks carry only wake-ups, never payloads, and the
# schedules, results and every broker table stay in PostgreSQL; the ORM queue stays the default.
BROKER_Q_REDIS_URL = env_str("BROKER_Q_REDIS_URL")
if BROKER_Q_REDIS_URL:
    del Q_CLUSTER["orm"], Q_CLUSTER["broker_class"]
    Q_CLUSTER["redis"] = BROKER_Q_REDIS_URL
if TESTING:
    Q_CLUSTER["sync"] = env_bool("BROKER_Q_SYNC", True)

# One logging configuration for Django and gunicorn's own lines (broker.logs.logging_config).
LOGGING = logging_config(fmt=env_str("BROKER_LOG_FORMAT") or ("plain" if DEBUG or TESTING else "json"),
                         level=env_str("BROKER_LOG_LEVEL", "INFO"), task_log=env_bool("BROKER_Q_TASK_LOG", False))

# --- retention (jobs/sweeps/retention.py, a housekeeping step) -----------------------------------
# A message whose jobs are all finished is removed (with its jobs, history and attempts) once older
# than its channel's ``retention`` or, when that is empty, BROKER_RETENTION; a DEAD job counts as
# finished once dead for BROKER_DEAD_RETENTION (the Spark archive reads the same setting).
BROKER_RETENTION = env_duration("BROKER_RETENTION", "7d")
BROKER_DEAD_RETENTION = env_duration("BROKER_DEAD_RETENTION", "90d")  # as the archive's --dead-older-than always was

# --- Spark pipeline (pipeline/: analytics report, archive-and-prune; see pipeline/__init__.py) ---
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")  # any Spark master URL: local[N], spark://host:7077, ...
BROKER_SPARK_DRIVER_MEMORY = env_str("BROKER_SPARK_DRIVER_MEMORY", "4g")
BROKER_JDBC_JAR = env_str("BROKER_JDBC_JAR", "/usr/share/java/postgresql.jar")  # Debian libpostgresql-jdbc-java
BROKER_SPARK_JDBC_PARTITIONS = env_int("BROKER_SPARK_JDBC_PARTITIONS", 4)  # parallel JDBC reads per table
BROKER_PIPELINE_DIR = Path(env_str("BROKER_PIPELINE_DIR", str(BROKER_DATA_DIR / "pipeline")))
# Every pipeline read is cut into chunks of about this many rows, each its own short transaction
# (pipeline.readers): no read holds a snapshot, and so vacuum, for longer than a chunk takes.
BROKER_PIPELINE_CHUNK_ROWS = env_int("BROKER_PIPELINE_CHUNK_ROWS", 20_000)
# A replica for the pipeline's reads (docs/high-availability.md): when set, every read of the report,
# the archive and the notebook goes there (the Django alias "pipeline" and the JDBC URL); the
# archive's bookkeeping and its prune still write to DATABASE_URL.
BROKER_PIPELINE_DATABASE_URL = env_str("BROKER_PIPELINE_DATABASE_URL")
if BROKER_PIPELINE_DATABASE_URL:
    try:
        DATABASES["pipeline"] = django_database(BROKER_PIPELINE_DATABASE_URL)
    except DatabaseUrlError as exc:
        raise ImproperlyConfigured(f"BROKER_PIPELINE_DATABASE_URL: {exc}") from None
    DATABASES["pipeline"]["OPTIONS"].setdefault("application_name", "broker-pipeline")
    DATABASES["pipeline"]["OPTIONS"]["options"] = " ".join(
        x for x in (DATABASES["pipeline"]["OPTIONS"].get("options", ""), SESSION_OPTIONS) if x)
    DATABASES["pipeline"]["TEST"] = {"MIRROR": "default"}  # a test run reads its own test database

# --- push delivery (jobs/push/, see jobs/push/dispatcher.py) -----------------------------------
# Dispatcher loops per qcluster (by cluster name); each occupies one django-q2 worker, so the
# default leaves one worker free for scheduled tasks.
BROKER_PUSH_DISPATCHERS = env_int("BROKER_PUSH_DISPATCHERS", max(1, Q_CLUSTER["workers"] - 1))
BROKER_PUSH_CONCURRENCY = env_int("BROKER_PUSH_CONCURRENCY", 256)  # callbacks in flight per dispatcher
BROKER_PUSH_BATCH = env_int("BROKER_PUSH_BATCH", 200)  # most jobs claimed by one statement
# New connections a dispatcher loop opens to one endpoint (scheme, host, port) per second, as many at
# once: an endpoint that hangs gets connections at this pace, never hundreds in one go (jobs/callbacks/http.py).
BROKER_PUSH_CONNECT_RATE = env_float("BROKER_PUSH_CONNECT_RATE", 20.0)
# Trace context (issue 25): spans are exported when the standard OTEL_* variables ask for traces
# (an OTLP endpoint, or OTEL_TRACES_EXPORTER); otherwise the OpenTelemetry SDK is never imported.
OTEL_TRACING = otel_configured(os.environ)
BROKER_PUSH_POLL = env_float("BROKER_PUSH_POLL", 1.0)  # safety-net poll; wake-ups come by NOTIFY
BROKER_PUSH_IDLE_POLL = env_float("BROKER_PUSH_IDLE_POLL", 5.0)  # ... once a loop has been idle for 10 s
# Under load a dispatcher loop records and claims at most once per this many seconds (a batch per
# transaction); after a quiet spell the first claim runs at once (jobs/push/dispatcher.py).
BROKER_PUSH_WINDOW = env_float("BROKER_PUSH_WINDOW", 0.05)
# A waiting (long-polling) pull claims at most once per this many seconds per consumer and web
# process: under load it takes the batch that gathered meanwhile (jobs/pull/claim.py).
# (0.2 s until 2026-11-29: 0.1 s halved pull p50 and cut pull p99 by a third at 1,000/s for ~5 % more
# CPU, with the publishing window below; bench/capacity.py, three runs each, in the README)
BROKER_PULL_WINDOW = env_float("BROKER_PULL_WINDOW", 0.1)
# Waiting (long-polling) pulls of one web process that keep their idle connection while they sleep;
# the others close it (jobs/pull/wakeups.py connection_parked).
BROKER_PULL_WAIT_CONNECTIONS = env_int("BROKER_PULL_WAIT_CONNECTIONS", 4)
# Single publishes that arrive together in one process share one transaction and commit (group
# commit: jobs/publish/grouped.py); off: each publishes in its request's thread.
BROKER_PUBLISH_GROUP = env_bool("BROKER_PUBLISH_GROUP", True)
# Seconds between two batches' starts in one process (0.025, 0.015 from 2026-11-29, 0.025 again): each
# web process batches its own publishes, so with the 64 connections of a 1,000/s load split between
# two workers a 15 ms window committed 0.43 times per message (0.25 all in one): PostgreSQL 0.35-0.38
# ms/msg; at 25 ms 0.31-0.33, publish p99 32-34 ms instead of 22 (README, thirteenth session).
BROKER_PUBLISH_WINDOW = env_float("BROKER_PUBLISH_WINDOW", 0.025)
# Admission: a single publish is refused at once (503 overloaded, Retry-After) when the publishes
# queued before it in its process have waited longer than this many seconds (0: never refused):
# jobs/publish/grouped.py publish_admission, and the web server's event loop lag (web/server/native.py).
BROKER_PUBLISH_ADMIT_WAIT = env_float("BROKER_PUBLISH_ADMIT_WAIT", 0.5)
# ... and, while the machine's CPU pressure (broker/pressure.py: the share of the last second some
# task waited for a CPU) is at least BROKER_PUBLISH_ADMIT_PRESSURE, as soon as they have waited
# BROKER_PUBLISH_ADMIT_PRESSED_WAIT (the publishes before it or the batch in flight): an offered load
# the machine cannot carry is refused sooner. 0: off, the default (measured in the README's
# "Headroom": it sheds more in a burst, but at 0.8 it also refused 1 publish in 120,000 at 1,000/s).
BROKER_PUBLISH_ADMIT_PRESSURE = env_float("BROKER_PUBLISH_ADMIT_PRESSURE", 0.0)
BROKER_PUBLISH_ADMIT_PRESSED_WAIT = env_float("BROKER_PUBLISH_ADMIT_PRESSED_WAIT", 0.05)
# ... and those over a rate while the push deliveries are more than this many seconds behind and not
# catching up (jobs/publish/admission.py, from the dispatchers' reports: jobs/push/lag.py). 0: off.
BROKER_PUBLISH_ADMIT_LAG = env_float("BROKER_PUBLISH_ADMIT_LAG", 1.0)
# Wake-ups of new jobs are sent after the publishing commit, at most one NOTIFY per this many seconds
# per process (the first after a quiet spell at once): broker/db/notify.py.
BROKER_NOTIFY_INTERVAL = env_float("BROKER_NOTIFY_INTERVAL", 0.05)
BROKER_PUSH_LOOP_SECONDS = env_float("BROKER_PUSH_LOOP_SECONDS", 60.0)  # < Q_CLUSTER timeout
BROKER_PUSH_EXCERPT_BYTES = env_int("BROKER_PUSH_EXCERPT_BYTES", 1024)  # response body kept per attempt
BROKER_SECRET_ROTATION_GRACE = env_float("BROKER_SECRET_ROTATION_GRACE", 24 * 3600.0)
# Callback URL policy (broker/netpolicy.py): no loopback, private, link-local, multicast or
# unspecified targets, checked at registration and again at connect time; the allow list takes
# host names, addresses and CIDR networks allowed anyway.
BROKER_CALLBACK_DENY_PRIVATE = env_bool("BROKER_CALLBACK_DENY_PRIVATE", not DEBUG)
BROKER_CALLBACK_ALLOW = env_str("BROKER_CALLBACK_ALLOW")

# --- admin (the operator's admin: web/site.py, jobs/dashboard.py) ------------------------
# The admin site whose index is the dashboard replaces django.contrib.admin's default site.
INSTALLED_APPS[INSTALLED_APPS.index("django.contrib.admin")] = "web.apps.BrokerAdminConfig"
BROKER_ADMIN_PAYLOAD_PREVIEW_BYTES = env_int("BROKER_ADMIN_PAYLOAD_PREVIEW_BYTES", 64 * 1024)  # shown per payload
FORMAT_MODULE_PATH = ["broker.formats"]

# --- the broker's public address ---------------------------------------------------------------
# The scheme and host (and path prefix) the outside world reaches the broker at, e.g.
# https://broker.example.com: the delivery portal's links and the inbound sources' URLs
# (``/in/{id}``) are made on it; empty: the scheme and host of the request that asks for one.
# BROKER_PORTAL_URL is its earlier name (the portal's links read it).
BROKER_PUBLIC_URL = env_str("BROKER_PUBLIC_URL", env_str("BROKER_PORTAL_URL")).rstrip("/")

# --- delivery portal (web/portal/: scoped links a consumer's team opens in a browser) -----------
BROKER_PORTAL_URL = BROKER_PUBLIC_URL
# Link openings allowed per client address and minute (shared by every web process); more: 429.
BROKER_PORTAL_OPENS_PER_MINUTE = env_int("BROKER_PORTAL_OPENS_PER_MINUTE", 20)
# A portal session without a request for this long ends (its page says so; the link opens a new one).
BROKER_PORTAL_IDLE = env_duration("BROKER_PORTAL_IDLE", "30m")  # admin dates as 2026-11-22 19:25:54 (broker/formats/en/formats.py)
