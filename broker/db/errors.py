"""Refusals the database makes on the domain's behalf, as domain errors; and which database errors
mean "unavailable, try again" (``database_unavailable``)."""

from __future__ import annotations

import psycopg
from django.db import DatabaseError, DataError, InterfaceError, OperationalError

from broker.errors import Conflict


class IllegalTransition(Conflict):
    """A job status move outside the transition table (``jobs.state.transitions``): a 409 Conflict with
    code ``illegal_transition``. Raised before any SQL by the guarded moves, and mapped from the
    database's SQLSTATE ``BRK01`` (the history trigger enforces the same table) by
    ``broker.db.run``, so it fails the same way from every path."""

    def __init__(self, detail: str) -> None:
        super().__init__("illegal_transition", detail)


# Every database error: Django's, and psycopg's own (raw and dedicated connections, the bound cursor).
DB_ERRORS = (DatabaseError, psycopg.Error)
DB_RETRY = 0.5  # seconds a loop waits before its next attempt while the database is unavailable

# SQLSTATEs that say "the database cannot serve this now, try again" rather than "this request is
# wrong": the server is read-only (a standby, a demoted primary: 25006), shutting down or restarting
# or the session was terminated (57P01-57P03), a statement or lock wait ran past its bound (57014,
# 55P03), a serialization failure or deadlock (40001, 40P01), and whole classes 08 (connection) and
# 53 (out of resources: too many connections, disk full).
UNAVAILABLE_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03", "57014", "55P03", "40001", "40P01"})
UNAVAILABLE_CLASSES = ("08", "53")
READ_ONLY_SQLSTATE = "25006"
# A prepared statement refused after its result columns changed type (a migration ran meanwhile):
# the statement is dropped with the transaction's rollback, so trying again succeeds (broker.db.run).
PLAN_CHANGED_SQLSTATE = "0A000"
PLAN_CHANGED_MESSAGE = "cached plan must not change result type"


def sqlstate_of(exc: BaseException) -> str:
    """The SQLSTATE of a psycopg error, or of the psycopg error a Django one wraps ('' if none)."""
    for candidate in (exc, exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return state
    return ""


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot serve right now (down, unreachable, a connection
    cut, failing over, read-only, a bound passed): a request answers 503 with Retry-After and a
    loop reconnects, rather than a 500."""
    if isinstance(exc, (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)):
        return True
    if not isinstance(exc, (DatabaseError, psycopg.Error)):
        return False
    state = sqlstate_of(exc)
    if state == PLAN_CHANGED_SQLSTATE:  # a prepared statement outlived a migration (broker.db.run): gone on retry
        return PLAN_CHANGED_MESSAGE in str(exc)
    return state in UNAVAILABLE_SQLSTATES or state[:2] in UNAVAILABLE_CLASSES


def database_refused_value(exc: BaseException) -> bool:
    """Whether the database (or psycopg, before sending it) refused a value the request carried: a
    NUL character in text (PostgreSQL text cannot hold one), a string that is not valid UTF-8 (a lone
    surrogate from JSON ``"\\ud800"``), or a data exception (SQLSTATE class 22: invalid text for a
    type, a number or interval out of range). Bad input, answered 400: nothing was written."""
    if isinstance(exc, UnicodeEncodeError):
        return True
    if not isinstance(exc, (DataError, psycopg.DataError)):
        return False
    state = sqlstate_of(exc)
    return state == "" or state.startswith("22")  # "": psycopg's own check (NUL), before the server


def database_read_only(exc: BaseException) -> bool:
    """Whether the server refused a write as read-only: the connection is on a standby (or a
    demoted primary) and must be replaced, not reused (Django keeps a connection that still answers)."""
    return sqlstate_of(exc) == READ_ONLY_SQLSTATE
