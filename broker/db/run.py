"""The one way to run a query (a named ``Query``, or SQL text still built in Python) on Django's
connection and in its transaction.

Two bindings, chosen per call:

- ``prepare=False`` (the default): Django's cursor, parameters bound on the client, the statement
  planned with its values on every run. Right for everything off the hot paths.
- ``prepare=True``: a server-side prepared statement with server-side binding, prepared once per
  connection and then reused (``BROKER_PREPARED_STATEMENTS``). For the hot multi-CTE statements
  planning costs more than running them (measured per spec-path transition: 0.91 -> 0.34 ms of
  database CPU, auth lookup 0.27 -> 0.06 ms). The SQL must cast its placeholders
  (``%(job)s::bigint``): with server-side binding the server must know each parameter's type.

``bound_cursor`` is the push dispatcher's variant: a psycopg cursor with server-side binding in
Django's transaction, for callers that run several statements with ``prepare=True``.

After a migration changes the type of a column a prepared statement returns, the server refuses to
run it ("cached plan must not change result type", SQLSTATE 0A000) for as long as the session
keeps it, which psycopg does for the connection's life (``CONN_MAX_AGE``). ``_run_mapped`` drops
the session's prepared statements and runs the statement once more (outside a transaction; in one,
the transaction is already aborted: its rollback drops them, and the error is a "try again",
``broker.db.errors.database_unavailable``: a request answers 503 with Retry-After, a loop goes on).
"""

from __future__ import annotations

from contextlib import contextmanager

import psycopg
from django.conf import settings
from django.db import connection, transaction

from broker.db.errors import DB_ERRORS, PLAN_CHANGED_MESSAGE, PLAN_CHANGED_SQLSTATE, IllegalTransition, sqlstate_of
from broker.db.queries import Query
from broker.queries import Q

# The SQLSTATE the job history trigger raises for a status move outside the transition table
# (jobs/migrations/0017, jobs.state.transitions): mapped to IllegalTransition, as the Python check raises.
ILLEGAL_TRANSITION_SQLSTATE = "BRK01"

# plan_cache_mode = force_generic_plan on every connection of the broker (``jobs.apps``), decided
# for the server-side prepared statements of the hot paths (``prepare=True``, the push
# dispatcher), the only statements it applies to (Django binds its own queries client-side):
# - each is written so that one plan is right for every parameter value (statuses inlined, ids
#   looked up by primary key, LIMIT on an index walk in the index's order), and tests/plans checks
#   that its generic plan uses the index it was written for, with the statistics a new backlog
#   meets and after ANALYZE;
# - planning costs more than running them (a pull claim plans in ~0.7 ms and runs in ~1 ms), so a
#   plan made once per connection is what keeps a pull cheap;
# - custom plans follow the statistics of the moment: right after a backlog appears those describe
#   the small table of before, and the plan flipped (queued-jobs 8.8 ms at 10k, 73.5 ms at 100k,
#   5.0 ms at 1M); under ``auto`` PostgreSQL also re-plans (custom) whenever its estimate favours it.
PLAN_CACHE_MODE = "force_generic_plan"


def connection_plan_setup(sender=None, connection=None, **kwargs) -> None:
    """Django's ``connection_created``: plan the session's prepared statements generically (see
    PLAN_CACHE_MODE), and set the session's bounds (``session_bounds``). Sent in autocommit right
    after connecting, so no rollback undoes them."""
    if connection is None or connection.vendor != "postgresql":
        return
    bounds = session_bounds()
    if bounds is not None:
        with connection.cursor() as cur:
            cur.execute(Q.session_settings_set.sql, bounds)
    if not getattr(settings, "BROKER_PREPARED_STATEMENTS", True):
        return  # nothing is prepared: every statement is planned with its values
    with connection.cursor() as cur:
        cur.execute(Q.plan_cache_mode_set.sql)  # SET plan_cache_mode = PLAN_CACHE_MODE


def session_bounds() -> dict | None:
    """Parameters of ``session_settings_set`` for a new session: its statement and
    idle-in-transaction timeouts (``settings.BROKER_DB_SESSION_SETTINGS``); None when there are none."""
    values = getattr(settings, "BROKER_DB_SESSION_SETTINGS", None)
    if not values:
        return None
    return {"names": list(values), "values": list(values.values())}


def _sql(q: Query | str) -> str:
    return q.sql if isinstance(q, Query) else q


@contextmanager
def transition_errors():
    """Turn the database's refusal of an illegal job status move (SQLSTATE ``BRK01``) into
    IllegalTransition; every other error passes unchanged."""
    try:
        yield
    except DB_ERRORS as exc:
        if sqlstate_of(exc) == ILLEGAL_TRANSITION_SQLSTATE:
            cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            raise IllegalTransition(getattr(cause.diag, "message_primary", None) or str(cause)) from exc
        raise


def _run(q: Query | str, params, prepare: bool, fetch):
    """Execute ``q`` and hand the cursor to ``fetch``, in the binding ``prepare`` asks for (under
    the planner settings its registry entry names, if any)."""
    with transition_errors():
        if isinstance(q, Query) and q.settings:
            return _run_with_settings(q, params, prepare, fetch)
        return _run_mapped(q, params, prepare, fetch)


def _run_with_settings(q: Query, params, prepare: bool, fetch):
    """``q`` in a transaction (the caller's, if any) under its ``settings:`` (SET LOCAL), which are
    reset right after it so that the caller's next statements plan as before."""
    names = [name for name, _ in q.settings]
    with transaction.atomic(savepoint=False):
        _run_mapped(Q.settings_local_set, {"names": names, "values": [value for _, value in q.settings]},
                    False, _rows)
        result = _run_mapped(q, params, prepare, fetch)
        # (after a failure the transaction is aborted and its rollback undoes the SET LOCAL too)
        _run_mapped(Q.settings_local_reset, {"names": names}, False, _rows)
        return result


def _run_mapped(q: Query | str, params, prepare: bool, fetch):
    if not prepare:
        with connection.cursor() as cur:
            cur.execute(_sql(q), params)
            return fetch(cur)
    try:
        return _run_prepared(q, params, fetch)
    except DB_ERRORS as exc:
        if not plan_changed(exc) or connection.in_atomic_block:
            raise  # (in a transaction: aborted; Django's rollback has psycopg deallocate every statement)
        prepared_statements_drop()
        return _run_prepared(q, params, fetch)


def plan_changed(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a prepared statement whose result columns changed type
    since it was prepared (a migration ran meanwhile)."""
    if sqlstate_of(exc) != PLAN_CHANGED_SQLSTATE:
        return False
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return PLAN_CHANGED_MESSAGE in (getattr(getattr(cause, "diag", None), "message_primary", None) or str(exc))


def prepared_statements_drop() -> None:
    """Drop every prepared statement of Django's connection, on the server and in psycopg's cache
    of their names, keeping the session (its settings and session locks: the retention sweep's).
    psycopg's ``rollback()`` does both (``DEALLOCATE ALL``) when a transaction is open, so one is
    opened for it. Outside a transaction only; the next ``prepare=True`` prepares anew."""
    raw = connection.connection
    raw.execute(Q.transaction_begin.sql)
    raw.rollback()


def _run_prepared(q: Query | str, params, fetch):
    # Django turns psycopg's prepared statements off (``prepare_threshold=None``) for the sake of
    # transaction-mode connection poolers; this enables them on the connection for explicit
    # requests only (Django's own queries use client-side binding and are never prepared). Set
    # ``BROKER_PREPARED_STATEMENTS = False`` behind a pooler that cannot keep them (PgBouncer < 1.21).
    connection.close_if_health_check_failed()  # what connection.cursor() does, without a cursor
    raw = _preparing_connection()
    enabled = getattr(settings, "BROKER_PREPARED_STATEMENTS", True)
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cur:
        cur.execute(_sql(q), params, prepare=True if enabled else None)
        return fetch(cur)


def _preparing_connection() -> psycopg.Connection:
    """Django's psycopg connection (connected), with explicit preparation enabled: psycopg ignores
    ``prepare=True`` while ``prepare_threshold`` is None, which is how Django leaves it."""
    connection.ensure_connection()
    raw = connection.connection
    if getattr(settings, "BROKER_PREPARED_STATEMENTS", True) and raw.prepare_threshold is None:
        raw.prepare_threshold = 1 << 30  # never automatic: only statements executed with prepare=True
    return raw


def _rows(cur) -> list[tuple]:
    # pgresult, not cur.description (which builds a Column per column, ~5% of a pull request);
    # Django's cursor wrapper passes the attribute through to psycopg's cursor
    result = cur.pgresult
    return cur.fetchall() if result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK else []


def query_fetchall(q: Query | str, params=None, *, prepare: bool = False) -> list[tuple]:
    """Every row of ``q`` (an empty list for a statement that returns none)."""
    return _run(q, params, prepare, _rows)


def query_fetchone(q: Query | str, params=None, *, prepare: bool = False) -> tuple | None:
    """The first row of ``q``, or None."""
    return _run(q, params, prepare, lambda cur: cur.fetchone() if cur.description else None)


def query_execute(q: Query | str, params=None, *, prepare: bool = False) -> int:
    """Run ``q`` for its effect; returns the number of rows it touched."""
    return _run(q, params, prepare, lambda cur: cur.rowcount)


def array_literal(values, *, text: bool = False) -> str:
    """A PostgreSQL array literal (``{1,2,NULL}``; ``text``: every element double-quoted and escaped)
    for a bound parameter the statement casts (``%(ids)s::bigint[]``). psycopg dumps a Python list
    element by element in Python (~1 us each: a push record's 13 arrays of a 50-attempt batch cost
    more CPU than the rest of its transaction); this is one join. Numbers go as their ``str`` (an
    int enum's is its value)."""
    if None not in values:
        if not text:
            return "{" + ",".join(map(str, values)) + "}"
        joined = "".join(values)
        if '"' not in joined and "\\" not in joined:
            return '{"' + '","'.join(values) + '"}' if values else "{}"
    if text:
        return "{" + ",".join("NULL" if v is None else
                              '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def bound_cursor() -> psycopg.Cursor:
    """A psycopg cursor with server-side parameter binding on Django's connection (and in its
    transaction), for the push hot path: Django's default client-side binding quotes every array
    element into the SQL text (~0.2 ms per statement here), while bound parameters travel as-is.
    Its statements are executed with ``prepare=True`` (Django turns psycopg's automatic
    preparation off), so the planning of the claim (~0.7 ms) is paid once per connection when
    the caller also asks for generic plans (``jobs.push.claim.PUSH_TRANSACTION_SETUP``). (Until
    issue 28 it left preparation off, so every push claim and record was planned again: 2.4 ms of
    database CPU per dispatcher transaction.)"""
    return psycopg.Cursor(_preparing_connection())
