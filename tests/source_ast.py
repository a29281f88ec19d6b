"""``ast.parse`` for the tests that read source files (architecture, client and bench checks).

CPython 3.11's AST builder keeps its depth counter per interpreter, not per thread
(python/cpython#106905): a thread building an AST at the same moment upsets it, and ``ast.parse``
raises a spurious ``SystemError: AST constructor recursion depth mismatch``. Such a thread need not
parse anything itself: 3.11's ``traceback`` parses the failing line to draw its ``^^^`` marks, so a
background thread logging an exception while a test reads the sources is enough (CI met it once).
The source is not at fault, so the parse is tried again.
"""

from __future__ import annotations

import ast

TRIES = 3


def parse_source(source: str, filename: str = "<source>") -> ast.Module:
    """``ast.parse(source)``, tried up to TRIES times on that SystemError (the last one's is raised)."""
    for _ in range(TRIES - 1):
        try:
            return ast.parse(source, filename=filename)
        except SystemError:
            pass
    return ast.parse(source, filename=filename)
