"""Structured JSON log lines (one object per line), the default outside debug.

Context fields passed with ``extra=`` (``job_id``, ``message_id``, ``consumer_id``, ``channel_id``,
``status_code``, ``duration_ms``, ``outcome`` ...) become top-level keys, so delivery lines can be
filtered by id. Tokens, secrets and payloads are never passed to loggers.
"""

from __future__ import annotations

import json
import logging
import re
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
