"""The facts: the dataset's rows of every finished day, kept as Parquet so a day is read once.

Where: ``BROKER_PIPELINE_DIR/facts/`` whatever a report's ``--out`` (one store per broker; on a
cluster a POSIX mount every node sees, as for the archive). Layout, schema version ``v1``::

    facts/.lock                                           one writer at a time (fcntl)
    facts/v1/days/YYYY-MM-DD.json                         a day's marker: it is committed
    facts/v1/{jobs,attempts,transitions}/day=D/channel=C/<generation>-part-*.parquet
    facts/v1/retired.json                                 files replaced by a rebuild, deleted later
    facts/v1/_work/<run>/                                 a run's staging (same file system)

A day counts only once its marker exists, and readers read exactly the files its marker lists, so
a reader never sees half a day. Committing a day: its staged files are renamed into place with
the run's generation prefix (atomic, once per file), then the marker is written (temporary file,
fsync, rename). A crash before the marker leaves files no marker lists: the day is read again next
time and the leftovers of an earlier attempt are deleted when the day is committed. A rebuild
writes a new generation and retires the old files; they are deleted an hour later (``GRACE``), so
a run that listed them before the swap can still read them. A new schema version is a new folder:
the old facts are ignored and the days recomputed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator

from django.conf import settings

SCHEMA_VERSION = 1
TABLES = ("jobs", "attempts", "transitions")
GRACE = 3600.0  # seconds a retired file stays readable
WORK_MAX_AGE = 86400.0  # a staging folder left this long by a run that died is deleted


@dataclass
class DayMarker:
    """A committed day: its files per table (relative to the version folder) and what it holds."""

    day: str
    generation: str
    finished: str
    rows: dict = field(default_factory=dict)  # table -> rows
    files: dict = field(default_factory=dict)  # table -> [relative paths]
    missing: dict = field(default_factory=dict)  # channel -> jobs retention removed without archive
    sources: dict = field(default_factory=dict)  # "live" / "archive" -> jobs
    written_at: str = ""
    schema: int = SCHEMA_VERSION

    @property
    def missing_jobs(self) -> int:
        return sum(self.missing.values())

    def as_dict(self) -> dict:
        return {"schema": self.schema, "day": self.day, "generation": self.generation, "finished": self.finished,
                "rows": self.rows, "missing": self.missing, "sources": self.sources,
                "written_at": self.written_at, "files": self.files}

    @classmethod
    def from_dict(cls, data: dict) -> DayMarker:
        return cls(day=data["day"], generation=data["generation"], finished=data.get("finished", ""),
                   rows=data.get("rows", {}), files=data.get("files", {}), missing=data.get("missing", {}),
                   sources=data.get("sources", {}), written_at=data.get("written_at", ""),
                   schema=data.get("schema", SCHEMA_VERSION))


def _durable_write(path: Path, data) -> None:
    """Write JSON next to ``path``, fsync it, rename it over ``path`` and fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FactsStore:
    """The facts folder of one broker (``BROKER_PIPELINE_DIR/facts`` unless given)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root if root is not None else Path(settings.BROKER_PIPELINE_DIR) / "facts").resolve()
        self.base = self.root / f"v{SCHEMA_VERSION}"

    # --- reading ------------------------------------------------------------------------------

    def markers(self, days: Iterable[str] | None = None) -> dict[str, DayMarker]:
        """The committed days among ``days`` (all when None), by day."""
        folder = self.base / "days"
        names = ([f"{d}.json" for d in days] if days is not None
                 else [p.name for p in folder.glob("*.json")] if folder.is_dir() else [])
        found = {}
        for name in names:
            try:
                marker = DayMarker.from_dict(json.loads((folder / name).read_text(encoding="utf-8")))
            except FileNotFoundError:
                continue
            if marker.schema == SCHEMA_VERSION:
                found[marker.day] = marker
        return found

    def files(self, markers: Iterable[DayMarker], table: str) -> list[Path]:
        return [self.base / rel for m in markers for rel in m.files.get(table, [])]

    # --- writing (under ``locked``) --------------------------------------------------------------

    @contextmanager
    def locked(self, say: Callable[[str], None] = lambda _m: None) -> Iterator[None]:
        """One writer at a time: a second run waits here until the first has committed."""
        self.base.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"waiting for another run writing facts in {self.root}")
                fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def work_dir(self, run_id: str) -> Path:
        path = self.base / "_work" / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def collect_garbage(self, *, keep: str | None = None, now: float | None = None) -> None:
        """Delete retired files past their grace and staging folders of runs that died (a writer's
        at once, since writers take turns; a reader's after a day)."""
        now = time.time() if now is None else now
        retired_path = self.base / "retired.json"
        if retired_path.exists():
            retired = json.loads(retired_path.read_text(encoding="utf-8"))
            kept = []
            for entry in retired:
                if now - entry["at"] < GRACE:
                    kept.append(entry)
                    continue
                for rel in entry["files"]:
                    (self.base / rel).unlink(missing_ok=True)
            if len(kept) != len(retired):
                _durable_write(retired_path, kept)
        work = self.base / "_work"
        for run in work.iterdir() if work.is_dir() else []:
            if run.name == keep:
                continue
            age = now - run.stat().st_mtime
            if run.name.startswith("write-") or age > WORK_MAX_AGE:
                shutil.rmtree(run, ignore_errors=True)

    def commit(self, *, day: str, generation: str, staged: dict[str, list[tuple[Path, Path]]], finished: str,
               rows: dict, missing: dict, sources: dict) -> DayMarker:
        """Make ``day`` committed with the ``staged`` files per table, each given with the folder
        it sits under at ``day=D/channel=C/`` (a staging root named for its source): rename them
        into place, then write the marker. Files of an earlier generation of the day are retired (a
        rebuild) or deleted (no marker lists them: leftovers of a run that died)."""
        old = self.markers([day]).get(day)
        listed = {rel for files in (old.files.values() if old else []) for rel in files}
        keep = listed | self._retired_files()
        files: dict[str, list[str]] = {}
        for table in TABLES:
            target = self.base / table / f"day={day}"
            for stale in target.glob("channel=*/*.parquet") if target.is_dir() else []:
                if str(stale.relative_to(self.base)) not in keep:
                    stale.unlink()
            moved = []
            for src, root in staged.get(table, []):
                dest = self.base / table / src.parent.relative_to(root) / f"{generation}-{root.parent.name}-{src.name}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dest)
                moved.append(str(dest.relative_to(self.base)))
            files[table] = sorted(moved)
        marker = DayMarker(day=day, generation=generation, finished=finished, rows=rows, files=files,
                           missing=missing, sources=sources, written_at=datetime.now(timezone.utc).isoformat())
        (self.base / "days").mkdir(parents=True, exist_ok=True)
        _durable_write(self.base / "days" / f"{day}.json", marker.as_dict())
        if listed:
            self._retire(sorted(listed))
        return marker

    def uncommit(self, day: str) -> None:
        """Forget a committed day (a rebuild found it unfinished again): marker first, then its files
        are retired."""
        old = self.markers([day]).get(day)
        if old is None:
            return
        (self.base / "days" / f"{day}.json").unlink()
        listed = sorted(rel for files in old.files.values() for rel in files)
        if listed:
            self._retire(listed)

    def _retired_files(self) -> set[str]:
        path = self.base / "retired.json"
        entries = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        return {rel for entry in entries for rel in entry["files"]}

    def _retire(self, files: list[str]) -> None:
        path = self.base / "retired.json"
        retired = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        retired.append({"at": time.time(), "files": files})
        _durable_write(path, retired)
