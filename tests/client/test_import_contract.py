"""The client's import contract (``client/.importlinter``): its modules in layers, top imports down
only, no cycle. Checked by import-linter over the client package as it is, and over a copy with
one upward import, so a contract that could never fail (a layer left out, a typo) fails here.

A third test keeps imports at the modules' tops: an import inside a function is how the cycle
consumer -> consume -> consumer used to hide from the import graph."""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.source_ast import parse_source

CLIENT = Path(__file__).resolve().parents[2] / "client"
CONFIG = CLIENT / ".importlinter"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contract_name() -> str:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    return parser["importlinter:contract:client-layers"]["name"]


def lint_imports(client: Path) -> subprocess.CompletedProcess:
    # ``client`` first on the path: the copy checked, not the installed (editable) package;
    # wide columns so the contract's name is printed on one line
    env = {**os.environ, "PYTHONPATH": str(client), "COLUMNS": "400"}
    return subprocess.run([str(LINT_IMPORTS), "--config", ".importlinter", "--no-cache", "--no-logo"],
                          cwd=client, env=env, capture_output=True, text=True, timeout=300)


def test_the_client_modules_keep_their_layers():
    result = lint_imports(CLIENT)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert f"{contract_name()} KEPT" in result.stdout, out
    assert "Contracts: 1 kept, 0 broken." in result.stdout, out


def test_the_contract_fails_on_an_upward_import(tmp_path):
    client = tmp_path / "client"
    shutil.copytree(CLIENT / "broker_client", client / "broker_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, client / ".importlinter")
    errors = client / "broker_client" / "errors.py"
    errors.write_text(errors.read_text() + "\nimport broker_client.consume  # the bottom layer importing a higher one\n")
    result = lint_imports(client)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert f"{contract_name()} BROKEN" in result.stdout, out
    assert "Contracts: 0 kept, 1 broken." in result.stdout, out
    assert "broker_client.errors is not allowed to import broker_client.consume" in result.stdout, out


def test_no_import_inside_a_function():
    offenders = []
    for path in sorted((CLIENT / "broker_client").glob("*.py")):
        for function in ast.walk(parse_source(path.read_text(), str(path))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                offenders.extend(f"{path.name}:{node.lineno} in {function.name}()" for node in ast.walk(function)
                                 if isinstance(node, (ast.Import, ast.ImportFrom)))
    assert not offenders, "imports inside functions (move them to the module's top):\n" + "\n".join(offenders)
