"""The import contracts of ``.importlinter`` (layers web > pipeline > jobs > consumers > eventtypes >
broker; no HTTP below web; the order of the packages inside jobs; the portal on top of web; the JSON
Schema library only in eventtypes), checked by import-linter in every test run
(``make test``, ``.ci/run``).

The second test runs the same contracts over a throw-away tree whose packages break each one, so
a contract that could never fail (a typo in a module name, a layer left out) fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path, *pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(cwd / ".importlinter"), "--no-cache", "--no-logo"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_apps_keep_their_layers_and_domain_code_does_not_speak_http():
    result = lint_imports(ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout, result.stdout


def test_each_contract_fails_on_a_violation(tmp_path):
    modules = {
        "broker/__init__.py": "",
        "broker/models.py": "import web.urls\n",  # a lower layer importing the top one
        "consumers/__init__.py": "",
        "consumers/services.py": "from django.http import JsonResponse\n",  # django.http below web
        "eventtypes/__init__.py": "",
        "eventtypes/rules.py": "import consumers.services\n",  # event types below consumers importing them
        "web/api/event_types.py": "import jsonschema_rs\n",  # a validator compiled outside eventtypes
        "jobs/__init__.py": "",
        # every layer of the jobs contract, one of them importing a higher one
        **{f"jobs/{name}/__init__.py": "" for name in ("management", "push", "pull", "ops", "sweeps", "publish",
                                                       "partitions", "callbacks", "advisories", "state")},
        **{f"jobs/{name}.py": "" for name in ("apps", "tasks", "housekeeping", "models")},
        "jobs/pull/claim.py": "from rest_framework.response import Response\n",  # DRF below web
        "jobs/state/transitions.py": "import jobs.pull.claim\n",  # the state machine importing the pull protocol
        "pipeline/__init__.py": "",
        "web/__init__.py": "",
        "web/urls.py": "import jobs.pull.claim\nfrom django.http import HttpResponse\nimport rest_framework\n",  # allowed
        "web/api/__init__.py": "",
        "web/admin/__init__.py": "import web.portal.pages\n",  # the admin depending on the portal
        "web/portal/__init__.py": "",
        "web/portal/pages.py": "import web.api\n",  # allowed: the portal reuses the API's pieces
    }
    for name, text in modules.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    # the fake apps first on the path; the repository root for the custom contract type (tests.system...)
    result = lint_imports(tmp_path, tmp_path, ROOT)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Contracts: 0 kept, 6 broken." in out, out
    assert "eventtypes.rules -> consumers.services" in out, out
    assert "web.api.event_types -> jsonschema_rs" in out, out
    assert "web.admin -> web.portal.pages" in out, out
    assert "broker.models -> web.urls" in out, out
    assert "jobs.pull.claim -> rest_framework" in out, out
    assert "jobs.state.transitions -> jobs.pull.claim" in out, out
    assert "consumers.services imports django.http" in out, out
