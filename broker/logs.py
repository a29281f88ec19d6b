"""Structured JSON log lines (one object per line), the default outside debug.

Context fields passed with ``extra=`` (``job_id``, ``message_id``, ``consumer_id``, ``channel_id``,
``status_code``, ``duration_ms``, ``outcome`` ...) become top-level keys, so delivery lines can be
filtered by id. Tokens, secrets and payloads are never passed to loggers.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import datetime, timezone

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class QuietTaskHeartbeat(logging.Filter):
    """Drops django-q2's INFO lines about single task runs (enqueued, created from a schedule,
    processing, processed): the broker's schedules run tasks every second, which buried the
    console. Its banner, worker start and stop lines, warnings and failures pass. Installed on
    the ``django-q`` logger unless ``BROKER_Q_TASK_LOG`` is on (broker/settings.py)."""

    PER_TASK = re.compile(r"^Enqueued \[|^Processed '| processing .* '| created task .* from schedule \[")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.INFO or not self.PER_TASK.search(record.getMessage())


def log_format_default(environ: Mapping[str, str]) -> str:
    """``BROKER_LOG_FORMAT`` when set, else plain in debug and tests and JSON otherwise (what
    broker/settings.py decides, readable before Django loads: gunicorn.conf.py)."""
    chosen = environ.get("BROKER_LOG_FORMAT", "").strip().lower()
    if chosen:
        return chosen
    debug = environ.get("DJANGO_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
    return "plain" if debug or environ.get("BROKER_TESTING") == "1" else "json"


def logging_config(*, fmt: str, level: str = "INFO", task_log: bool = False) -> dict:
    """The one logging configuration: Django's ``LOGGING`` (broker/settings.py) and gunicorn's
    ``logconfig_dict`` (gunicorn.conf.py), so the web server's own lines (start-up, workers, access
    log) come out in the same format as the broker's: plain text for ``make run``, a JSON object per
    line in production. gunicorn's loggers have no handler of their own and reach the root's."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {"()": "broker.logs.JsonFormatter"},
        },
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": fmt}},
        "root": {"handlers": ["stderr"], "level": level},
        # django-q2 logs an INFO line per task run (several a second with the broker's schedules):
        # dropped unless BROKER_Q_TASK_LOG; its banner, warnings and failures stay (QuietTaskHeartbeat).
        "filters": {"q_task_heartbeat": {"()": "broker.logs.QuietTaskHeartbeat"}},
        "loggers": {
            "django-q": {"filters": [] if task_log else ["q_task_heartbeat"]},
            "django.db.backends": {"level": "WARNING"},
            # 4xx answers are normal traffic for a broker (lost claim races, duplicates): not warnings.
            "django.request": {"level": "ERROR"},
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
        },
    }
