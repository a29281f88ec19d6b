"""Content filters of a consumer (issue 25): the pure rules of the ``filter`` field.

A filter is a JSON object ``{"body": {...}, "headers": {...}}``; ``$or`` / ``$and`` lists may
stand at any level. Inside ``body`` each key is a dotted path into the JSON payload
(``order.total``, ``items.0.sku``); inside ``headers`` a stored metadata header name (the
``X-Broker-Metadata-Headers`` of the publish; names case-insensitive, stored lower-case here).
Each value is a literal (equality) or an object of operators ``$eq $ne $in $nin $gt $gte $lt
$lte $exists $startsWith``; every condition must hold. A body condition never matches a payload
that is not JSON; ``$ne``, ``$nin`` and ``$exists: false`` match an absent key.

``filter_parse`` validates (400 ``invalid_filter`` naming what is wrong) and normalizes; the
database evaluates the stored object in the fan-out statement (``broker_filter_match``, created
by consumers/migrations/0011_filters_circuit_open_after.py), with the same semantics as
``filter_matches`` here, which the unit tests pin down and the SQL tests compare against.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from broker.errors import InvalidInput

SCOPES = ("body", "headers")
LOGICAL = ("$or", "$and")
OPERATORS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$startsWith")
FILTER_MAX_BYTES = 16_384  # the filter as compact JSON
CONDITIONS_MAX = 100  # conditions (operator uses) in one filter
DEPTH_MAX = 8  # nested $or / $and levels
PATH_MAX = 255
LIST_MAX = 100  # values of one $in / $nin


def _bad(detail: str) -> InvalidInput:
    return InvalidInput("invalid_filter", f"filter: {detail}")


class _Budget:
    """Counts conditions while parsing, so a filter stays cheap to evaluate per message."""

    def __init__(self) -> None:
        self.conditions = 0

    def spend(self, where: str) -> None:
        self.conditions += 1
        if self.conditions > CONDITIONS_MAX:
            raise _bad(f"more than {CONDITIONS_MAX} conditions (at {where})")


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_value(value: Any, where: str, headers: bool) -> None:
    """A literal to compare with: JSON (finite numbers); for headers a string (header values are text)."""
    if headers and not isinstance(value, str):
        raise _bad(f"{where} must be a string (header values are text)")
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"{where} must be a finite number")
    if isinstance(value, (list, dict)):
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise _bad(f"{where} must hold finite numbers") from None


def _operators(ops: dict, where: str, headers: bool, budget: _Budget) -> dict:
    if not ops:
        raise _bad(f"{where}: an empty operator object")
    result = {}
    for op, arg in ops.items():
        at = f"{where}.{op}"
        if op not in OPERATORS:
            raise _bad(f"{at}: unknown operator (one of {' '.join(OPERATORS)})")
        budget.spend(at)
        if op in ("$in", "$nin"):
            if not isinstance(arg, list) or not arg or len(arg) > LIST_MAX:
                raise _bad(f"{at} must be a list of 1 to {LIST_MAX} values")
            for i, item in enumerate(arg):
                _check_value(item, f"{at}[{i}]", headers)
        elif op in ("$gt", "$gte", "$lt", "$lte"):
            if not (_number(arg) or isinstance(arg, str)) or (headers and not isinstance(arg, str)):
                raise _bad(f"{at} must be a {'string' if headers else 'number or a string'}")
            _check_value(arg, at, headers)
        elif op == "$exists":
            if not isinstance(arg, bool):
                raise _bad(f"{at} must be true or false")
        elif op == "$startsWith":
            if not isinstance(arg, str):
                raise _bad(f"{at} must be a string")
        else:  # $eq, $ne
            _check_value(arg, at, headers)
        result[op] = arg
    return result


def _path(key: str, where: str, headers: bool) -> str:
    if not key or len(key) > PATH_MAX or key.startswith("$"):
        raise _bad(f"{where}: {key[:80]!r} is not a {'header name' if headers else 'dotted path'} "
                   f"(1-{PATH_MAX} characters, not starting with $)")
    if headers:
        if any(c in key for c in " :\r\n\t") or not key.isascii():
            raise _bad(f"{where}: {key[:80]!r} is not a header name")
        return key.lower()
    if any(part == "" for part in key.split(".")):
        raise _bad(f"{where}: {key[:80]!r} has an empty path segment")
    return key


def _conditions(node: Any, where: str, headers: bool, budget: _Budget, depth: int) -> dict:
    """The conditions of one scope (body or headers): paths to values, and $or / $and lists."""
    if not isinstance(node, dict) or not node:
        raise _bad(f"{where} must be a non-empty object of conditions")
    result: dict = {}
    for key, value in node.items():
        if key in LOGICAL:
            result[key] = _logical(value, f"{where}.{key}", budget, depth,
                                   lambda item, at, d: _conditions(item, at, headers, budget, d))
            continue
        name = _path(key, where, headers)
        at = f"{where}.{name}"
        if name in result:
            raise _bad(f"{at} is given twice")
        if isinstance(value, dict):
            result[name] = _operators(value, at, headers, budget)
        else:
            budget.spend(at)
            _check_value(value, at, headers)
            result[name] = value
    return result


def _logical(value: Any, where: str, budget: _Budget, depth: int, parse) -> list:
    if depth >= DEPTH_MAX:
        raise _bad(f"{where}: $or / $and nested deeper than {DEPTH_MAX} levels")
    if not isinstance(value, list) or not value:
        raise _bad(f"{where} must be a non-empty list of objects")
    return [parse(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]


def _top(node: Any, where: str, budget: _Budget, depth: int) -> dict:
    if not isinstance(node, dict) or not node:
        raise _bad(f"{where} must be a non-empty object with body, headers, $or or $and")
    result: dict = {}
    for key, value in node.items():
        if key in SCOPES:
            result[key] = _conditions(value, f"{where}.{key}" if where != "filter" else key, key == "headers",
                                      budget, depth)
        elif key in LOGICAL:
            result[key] = _logical(value, f"{where}.{key}" if where != "filter" else key, budget, depth,
                                   lambda item, at, d: _top(item, at, budget, d))
        else:
            raise _bad(f"unknown key {key[:80]!r} (body, headers, $or, $and)")
    return result


def filter_parse(raw: Any) -> dict | None:
    """The ``filter`` field: JSON text (the PUT form field, the seed, the admin form) or an already
    decoded object (a JSON request body). Returns the normalized filter (header names lower-case),
    or None for an empty value (no filter: every message). 400 ``invalid_filter`` otherwise."""
    if raw is None:
        return None
    if isinstance(raw, (str, bytes)):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if text.strip() in ("", "null", "{}"):
            return None
        if len(text.encode("utf-8", "surrogatepass")) > FILTER_MAX_BYTES * 4:
            raise _bad(f"longer than {FILTER_MAX_BYTES} bytes")
        try:
            raw = json.loads(text, parse_constant=lambda name: float("nan"))
        except (ValueError, RecursionError):
            raise _bad("not valid JSON") from None
    if raw is None or raw == {}:
        return None
    parsed = _top(raw, "filter", _Budget(), 0)
    try:
        size = len(json.dumps(parsed, separators=(",", ":"), allow_nan=False).encode())
    except ValueError:
        raise _bad("numbers must be finite") from None
    if size > FILTER_MAX_BYTES:
        raise _bad(f"longer than {FILTER_MAX_BYTES} bytes")
    if _has_nul(parsed):  # PostgreSQL jsonb cannot hold NUL
        raise _bad("must not contain NUL characters")
    return parsed


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def filter_text(value: dict | None) -> str:
    """A stored filter as the PUT takes it (compact JSON text; empty: no filter)."""
    return "" if not value else json.dumps(value, separators=(",", ":"), sort_keys=False)


# --- the semantics, in Python (the reference the SQL function is tested against) -----------------

_MISSING = object()


_INDEX = re.compile(r"[ \t\n\r\f\v]*[+-]?[0-9]+")  # an array index as PostgreSQL's #> reads one (strtol)


def _lookup(doc: Any, path: str) -> Any:
    """``doc #> path`` (dotted): object keys, array indexes (negative ones count from the end)."""
    for part in path.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and _INDEX.fullmatch(part):
            i = int(part)
            if not -len(doc) <= i < len(doc):
                return _MISSING
            doc = doc[i]
        else:
            return _MISSING
    return doc


def _same(a: Any, b: Any) -> bool:
    """JSON equality (jsonb's): numbers by value, booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) and _number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _compare(op: str, actual: Any, arg: Any) -> bool:
    if _number(actual) and _number(arg):
        pass
    elif isinstance(actual, str) and isinstance(arg, str):
        actual, arg = actual.encode("utf-8"), arg.encode("utf-8")  # byte order, as PostgreSQL's C collation
    else:
        return False
    return {"$gt": actual > arg, "$gte": actual >= arg, "$lt": actual < arg, "$lte": actual <= arg}[op]


def _value_matches(actual: Any, spec: Any) -> bool:
    if not isinstance(spec, dict):
        return actual is not _MISSING and _same(actual, spec)
    for op, arg in spec.items():
        present = actual is not _MISSING
        if op == "$eq":
            ok = present and _same(actual, arg)
        elif op == "$ne":
            ok = not present or not _same(actual, arg)
        elif op == "$in":
            ok = present and any(_same(actual, x) for x in arg)
        elif op == "$nin":
            ok = not present or not any(_same(actual, x) for x in arg)
        elif op == "$exists":
            ok = present == arg
        elif op == "$startsWith":
            ok = present and isinstance(actual, str) and actual.startswith(arg)
        else:
            ok = present and _compare(op, actual, arg)
        if not ok:
            return False
    return True


def _conditions_match(conds: dict, doc: Any, headers: bool) -> bool:
    for key, spec in conds.items():
        if key == "$and":
            ok = all(_conditions_match(c, doc, headers) for c in spec)
        elif key == "$or":
            ok = any(_conditions_match(c, doc, headers) for c in spec)
        else:
            actual = doc.get(key, _MISSING) if headers else _lookup(doc, key)
            ok = _value_matches(actual, spec)
        if not ok:
            return False
    return True


def filter_matches(flt: dict | None, *, body: Any = _MISSING, headers: dict | None = None) -> bool:
    """Does a message match the (parsed) filter? ``body``: the decoded JSON payload, left out when
    the payload is not JSON; ``headers``: the stored metadata headers. The SQL function
    ``broker_filter_match`` answers the same."""
    if not flt:
        return True
    lowered = {str(k).lower(): v for k, v in (headers or {}).items()}
    for key, spec in flt.items():
        if key == "$and":
            ok = all(filter_matches(f, body=body, headers=headers) for f in spec)
        elif key == "$or":
            ok = any(filter_matches(f, body=body, headers=headers) for f in spec)
        elif key == "body":
            ok = body is not _MISSING and _conditions_match(spec, body, False)
        else:
            ok = _conditions_match(spec, lowered, True)
        if not ok:
            return False
    return True
