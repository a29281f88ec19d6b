"""JSON numbers as integers: ``2.0`` is the integer 2 in JSON Schema 2020-12, which the OpenAPI 3.1
schema speaks (issue 37), and clients serializing a float send it so; every integer field of a
JSON body reads it through ``whole`` (``2.5`` stays a float and is refused where an integer is due)."""

from __future__ import annotations

EXACT = 2**53  # past this a float no longer spells one integer


def whole(value):
    """``value`` as an int when it is a float without a fraction (within ``EXACT``); else unchanged."""
    if isinstance(value, float) and value.is_integer() and -EXACT <= value <= EXACT:
        return int(value)
    return value
