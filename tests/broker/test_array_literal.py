"""``broker.db.run.array_literal``: the array literals the push record binds instead of lists read back
by PostgreSQL as the values they were made from (quotes, backslashes, braces, commas, the word NULL,
empty strings, non-ASCII; NULLs; floats and big integers)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from broker.db.run import array_literal
from jobs.models import JobStatus

TEXTS = ['plain', 'a "quoted" word', 'back\\slash\\', '{braces}', 'a,b', 'NULL', '', 'é ✓ 漢', ' spaced ', None]
NUMBERS = [0, -1, 2**62, JobStatus.DELIVERED, None]  # an int enum goes as its value
FLOATS = [0.1, 1e-05, -2.5, 1e300, 3.0, None]


@pytest.mark.django_db
def test_array_literals_read_back_as_the_values_they_were_made_from():
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:  # server-side binding, as the push record runs
        cur.execute("SELECT %(t)s::text[], %(n)s::int8[], %(f)s::float8[], %(b)s::bool[], %(e)s::text[], "
                    "%(p)s::text[]",
                    {"t": array_literal(TEXTS, text=True), "n": array_literal(NUMBERS),
                     "f": array_literal(FLOATS), "b": array_literal([True, False]), "e": array_literal([], text=True),
                     "p": array_literal(["x", "y"], text=True)})
        texts, numbers, floats, bools, empty, plain = cur.fetchone()
    assert texts == TEXTS and numbers == NUMBERS and floats == FLOATS and bools == [True, False]
    assert empty == [] and plain == ["x", "y"]
