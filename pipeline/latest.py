"""Where the latest report is: a small pointer file under ``BROKER_PIPELINE_DIR``, so the admin
dashboard can link to the newest report whichever ``--out`` it was written to."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings

POINTER = "latest-report.json"


def _pointer_path() -> Path:
    return Path(settings.BROKER_PIPELINE_DIR) / POINTER


def pipeline_report_record(*, out_dir: Path, figures: dict) -> None:
    """Remember ``out_dir`` as the latest report (atomic replace of the pointer file)."""
    path = _pointer_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "out_dir": str(out_dir), "html": str(Path(out_dir) / "report.html"),
        "generated_at": figures.get("generated_at"), "since": figures.get("since"),
        "until": figures.get("until"), "jobs": figures.get("jobs"),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def pipeline_report_latest() -> dict | None:
    """The latest report's pointer (out_dir, html, generated_at, since, until, jobs), or None
    when no report was written yet or its page has since been removed."""
    try:
        data = json.loads(_pointer_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not Path(data.get("html", "")).is_file():
        return None
    return data
