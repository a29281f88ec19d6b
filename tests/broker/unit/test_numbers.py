"""JSON numbers as integers (broker.numbers): OpenAPI 3.1 speaks JSON Schema 2020-12, where 2.0 is
the integer 2, so every integer field takes it, in JSON and as form text; a fraction stays refused."""

from __future__ import annotations

import pytest

from broker.durations import duration_parse
from broker.errors import InvalidInput
from broker.message_types import ttl_parse
from broker.numbers import whole, whole_text


def test_whole_numbers():
    assert whole(2.0) == 2 and isinstance(whole(2.0), int)
    assert whole(2.5) == 2.5 and whole(True) is True and whole("2.0") == "2.0" and whole(1e300) == 1e300
    assert whole_text("5.0") == "5" and whole_text(" -3.00 ") == "-3" and whole_text("5.5") == "5.5"
    assert whole_text("5.") == "5" and whole_text("1e3") == "1e3" and whole_text("x.0") == "x.0"


def test_integer_fields_take_them():
    assert ttl_parse(60.0) == 60 and ttl_parse("60.0") == 60 and duration_parse(5.0) == 5 and duration_parse("5.0") == 5
    with pytest.raises(InvalidInput):
        ttl_parse(60.5)
    with pytest.raises(ValueError):
        duration_parse("5.5")
