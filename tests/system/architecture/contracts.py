"""An import-linter contract type for submodules of external packages (``.importlinter``).

grimp models an external package as one node (``django.http`` and ``django.db`` are both
``django``), so the built-in forbidden contract can only forbid whole external packages. This one
reads the source modules' import lines of such a package and refuses those that name a forbidden
submodule (``from django.http import ...``, ``import django.http``, ``from django.contrib import
admin``).
"""

from __future__ import annotations

import ast
import re

from importlinter import Contract, ContractCheck, fields, output


def _imported_names(line: str) -> list[str]:
    """Full dotted names one import line brings in (the module alone when the line is cut)."""
    text = line.strip()
    try:
        node = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        match = re.match(r"(?:from|import)\s+([\w.]+)", text)
        return [match.group(1)] if match else []
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


class ForbiddenSubmodulesContract(Contract):
    """``source_modules`` (and their submodules) must not import ``forbidden_modules``, dotted names
    inside external packages."""

    type_name = "forbidden_submodules"
    source_modules = fields.ListField(subfield=fields.ModuleField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        sources = [m.name for m in self.source_modules]
        forbidden = list(self.forbidden_modules)
        violations = []
        for module in sorted(graph.modules):
            if not any(module == s or module.startswith(f"{s}.") for s in sources):
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                roots = [f for f in forbidden if f.split(".")[0] == imported]
                if not roots:
                    continue
                for detail in graph.get_import_details(importer=module, imported=imported):
                    names = _imported_names(detail["line_contents"])
                    hit = next((f for f in roots for n in names if n == f or n.startswith(f"{f}.")), None)
                    if hit:
                        violations.append((module, hit, detail["line_number"], detail["line_contents"]))
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, forbidden, line_number, line in check.metadata["violations"]:
            output.print_error(f"{module} imports {forbidden} (l.{line_number}: {line.strip()})", bold=False)
            output.new_line()
