"""Which JSON Schema library validates publishes (issue 37): the CPU of one validation of a payload
against a schema compiled once, per library, as the publish path runs it (the payload's bytes
parsed, then validated), for a payload that passes and one that fails (with the JSON pointer of
the fault, which the 422 answer carries). The schema is the 20-property one of
``bench/capacity.py --event-schema`` (``bench/common.py`` ``EVENT_SCHEMA``).

    python bench/schemas.py [--iterations 20000] [--rounds 5]

Libraries: ``jsonschema_rs`` (Rust, draft 2020-12), ``jsonschema`` (pure Python, draft 2020-12,
a validator built once) and ``fastjsonschema`` (generates Python code; drafts 4, 6 and 7 only, so
measured on the same schema read as draft 7). A library that is not installed is left out. No
database or server: the figures are of this process alone (median of the rounds, microseconds).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import EVENT_SCHEMA, event_payload, smoke_args_parse  # noqa: E402

SMOKE_TABLE = r"^library +valid us +invalid us +path$(?s:.*)^jsonschema_rs +[\d.]+ +[\d.]+ +/\S+$"


def _pointer(parts) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _jsonschema_rs():
    lib = importlib.import_module("jsonschema_rs")
    validator = lib.Draft202012Validator(EVENT_SCHEMA, validate_formats=True)

    def check(raw: bytes):
        try:
            validator.validate(json.loads(raw))
        except lib.ValidationError as exc:
            return _pointer(exc.instance_path)
        return None
    return check


def _jsonschema():
    lib = importlib.import_module("jsonschema")
    validator = lib.Draft202012Validator(EVENT_SCHEMA, format_checker=lib.Draft202012Validator.FORMAT_CHECKER)

    def check(raw: bytes):
        error = lib.exceptions.best_match(validator.iter_errors(json.loads(raw)))
        return None if error is None else _pointer(error.absolute_path)
    return check


def _fastjsonschema():
    lib = importlib.import_module("fastjsonschema")
    validate = lib.compile({**EVENT_SCHEMA, "$schema": "http://json-schema.org/draft-07/schema#"})

    def check(raw: bytes):
        try:
            validate(json.loads(raw))
        except lib.JsonSchemaValueException as exc:  # its path is a dotted name: data.items[1]
            return exc.name
        return None
    return check


LIBRARIES = {"jsonschema_rs": _jsonschema_rs, "jsonschema": _jsonschema, "fastjsonschema": _fastjsonschema}


def per_call_us(check, raw: bytes, iterations: int) -> float:
    started = time.process_time()
    for _ in range(iterations):
        check(raw)
    return 1e6 * (time.process_time() - started) / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20_000, help="validations per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = smoke_args_parse(parser, iterations=200, rounds=1)
    valid = json.dumps(event_payload(1, 1.5, "x" * 200)).encode()
    invalid = json.loads(valid)
    invalid["items"][1]["quantity"] = "two"
    invalid = json.dumps(invalid).encode()
    print(f"schema: 20 properties (nested object, array of objects, enum, pattern, formats); payload "
          f"{len(valid)} bytes; {args.iterations} validations x {args.rounds} rounds, CPU time", flush=True)
    print(f"{'library':<16} {'valid us':>10} {'invalid us':>11}  path")
    problems = []
    for name, make in LIBRARIES.items():
        try:
            check = make()
        except ImportError:
            print(f"{name:<16} (not installed)")
            continue
        if check(valid) is not None:
            problems.append(f"{name}: the valid payload failed at {check(valid)}")
        path = check(invalid)
        results = [(per_call_us(check, valid, args.iterations), per_call_us(check, invalid, args.iterations))
                   for _ in range(args.rounds)]
        print(f"{name:<16} {statistics.median(r[0] for r in results):10.2f} "
              f"{statistics.median(r[1] for r in results):11.2f}  {path}", flush=True)
    baseline = [per_call_us(json.loads, valid, args.iterations) for _ in range(args.rounds)]
    print(f"{'(json.loads)':<16} {statistics.median(baseline):10.2f}", flush=True)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
