"""The head of a stored payload, for the admin's previews: at most ``limit`` bytes are read from
the database (a 5 MB payload is never loaded whole), with its full size and content type."""

from __future__ import annotations

from broker.db.queries import Query
from broker.db.run import query_fetchone
from broker.queries import Q

# (first bytes, size in bytes, content type); None when there is no such row (or payload)
PayloadHead = tuple[bytes, int, str] | None


def payload_head_read(query: Query, *, pk: int, limit: int) -> PayloadHead:
    """Run a ``*_payload_head`` query (params: limit, id)."""
    row = query_fetchone(query, [limit, pk])
    if row is None:
        return None
    return bytes(row[0] or b""), int(row[1] or 0), row[2] or ""


def message_payload_head(*, pk: int, limit: int) -> PayloadHead:
    return payload_head_read(Q.message_payload_head, pk=pk, limit=limit)


def scheduled_payload_head(*, pk: int, limit: int) -> PayloadHead:
    return payload_head_read(Q.scheduled_payload_head, pk=pk, limit=limit)
