"""JSON numbers as integers: ``2.0`` is the integer 2 in JSON Schema 2020-12, which the OpenAPI 3.1
schema speaks (issue 37), and clients serializing a float send it so; every integer field of a
JSON body reads it through ``whole`` (``2.5`` stays a float and is refused where an integer is due)."""

from __future__ import annotations

import re

EXACT = 2**53  # past this a float no longer spells one integer


_WHOLE_TEXT = re.compile(r"\s*([+-]?[0-9]+)\.0*\s*")


def whole_text(text: str) -> str:
    """A number's text without a zero fraction (``"5.0"`` -> ``"5"``: a form field holding the
    integer 5 as a float prints it); any other text unchanged."""
    match = _WHOLE_TEXT.fullmatch(text)
    return match.group(1) if match else text


def whole(value):
    """``value`` as an int when it is a float without a fraction (within ``EXACT``); else unchanged."""
    if isinstance(value, float) and value.is_integer() and -EXACT <= value <= EXACT:
        return int(value)
    return value
