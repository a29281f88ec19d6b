"""What the event loop's handlers read from the process's caches (a source, a channel's event
types) is read again in the server's pool, never on the loop: a handler asks ``refresh_soon`` each
time it uses an entry, which runs the reading function in a pool thread at most once per
``REFRESH_EVERY`` per entry (the function itself reads the database only when its entry is due).
The loop serves from what is held meanwhile, and leaves a request to the full way when nothing
current is held (the first request, or after a quiet spell)."""

from __future__ import annotations

import logging
import time
import weakref

from broker.db.errors import DB_ERRORS

REFRESH_EVERY = 0.25  # seconds between two pool tasks for the same entry
KEPT = 10_000  # entries whose last task is remembered (a flood of keys: forgotten at once)
logger = logging.getLogger("broker.web.current")

_asked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Native -> {key: when last asked}


def refresh_soon(native, key, read, *args, **kwargs) -> None:
    """(event loop) ``read(*args, **kwargs)`` in ``native``'s server pool unless asked for ``key`` less than
    REFRESH_EVERY ago."""
    asked = _asked.get(native)
    if asked is None:
        asked = _asked[native] = {}
    now = time.monotonic()
    if now - asked.get(key, float("-inf")) < REFRESH_EVERY:
        return
    if len(asked) >= KEPT:
        asked.clear()
    asked[key] = now
    try:
        native.server.executor.submit(_read, read, args, kwargs)
    except RuntimeError:  # the pool is shut down (the worker stops): what is held ages out
        pass


def _read(read, args: tuple, kwargs: dict) -> None:
    """(pool thread) One reading; a database that cannot serve now leaves the entry to age out (the
    full way then answers, as it would without the loop)."""
    try:
        read(*args, **kwargs)
    except DB_ERRORS:
        logger.debug("could not read %s%r again", getattr(read, "__name__", read), args or kwargs, exc_info=True)
