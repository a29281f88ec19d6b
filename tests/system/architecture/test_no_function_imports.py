"""No import inside a function (they hid module cycles): every app module imports at its top.

Exceptions, each with its reason:
- ``ALLOWED_MODULES``: optional heavy dependencies, imported only where they are used;
- ``ALLOWED_FUNCTIONS``: places Django requires (``AppConfig.ready``), and the temporary list of
  modules being rewritten on another branch (issue 16 item 3), which the lead removes at merge.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_ast import parse_source

ROOT = Path(__file__).resolve().parents[3]
APPS = ("broker", "eventtypes", "consumers", "jobs", "pipeline", "sources", "web")

ALLOWED_MODULES = {
    "pyspark": "the [spark] extra, optional; ~1 s to import; only the pipeline command and its jobs use it",
    "nbclient": "the [spark] extra (notebook runs), optional",
    "playwright": "browser tests only, optional",
    "opentelemetry": "the [otel] extra, optional; imported only when OTEL_* asks for traces (broker.tracing), so "
                     "an unconfigured broker never loads it on its hot paths",
}
ALLOWED_FUNCTIONS = {
    ("jobs/apps.py", "ready"): "signal receivers whose modules import models: only once the app registry is ready",
    ("sources/apps.py", "ready"): "the hooks it registers below (housekeeping, seed) live in modules that import models",
}


def function_imports(path: Path) -> list[tuple[str, int, str]]:
    """(function name, line, imported module) of every import inside a function of ``path``."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if function is not None and isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [child.module or ""] if isinstance(child, ast.ImportFrom) else [a.name for a in child.names]
                if isinstance(child, ast.ImportFrom) and child.level:
                    names = ["." * child.level + (child.module or "")]
                found.extend((function, child.lineno, name) for name in names)
            visit(child, function)

    visit(parse_source(path.read_text(), str(path)), None)
    return found


def allowed(relative: str, function: str, module: str) -> bool:
    return (module.split(".")[0] in ALLOWED_MODULES or (relative, function) in ALLOWED_FUNCTIONS
            or (relative, "*") in ALLOWED_FUNCTIONS)


def test_no_import_inside_a_function():
    offenders = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for function, line, module in function_imports(path):
                if not allowed(relative, function, module):
                    offenders.append(f"{relative}:{line} in {function}(): import {module}")
    assert not offenders, "imports inside functions (move them to the module's top):\n" + "\n".join(offenders)


def test_the_walk_finds_nested_and_method_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\nclass C:\n    def m(self):\n        if True:\n            from json import dumps\n"
                      "\ndef f():\n    def g():\n        import pyspark.sql\n    return g\n")
    assert function_imports(source) == [("m", 6, "json"), ("g", 10, "pyspark.sql")]
    assert not allowed("x.py", "m", "json") and allowed("x.py", "g", "pyspark.sql")
