"""Refusals the database makes on the domain's behalf, as domain errors."""

from __future__ import annotations

from broker.errors import Conflict


class IllegalTransition(Conflict):
    """A job status move outside the transition table (``jobs.state.transitions``): a 409 Conflict with
    code ``illegal_transition``. Raised before any SQL by the guarded moves, and mapped from the
    database's SQLSTATE ``BRK01`` (the history trigger enforces the same table) by
    ``broker.db.run``, so it fails the same way from every path."""

    def __init__(self, detail: str) -> None:
        super().__init__("illegal_transition", detail)
