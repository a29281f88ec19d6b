"""The facts folder (plain files, no Spark): a day counts once its marker is written, its files
moved in with the run's generation; a rebuild retires the old files, deleted after the grace; a
run that died leaves nothing a reader would read."""

from __future__ import annotations

import json
import time

from pipeline.facts import GRACE, SCHEMA_VERSION, FactsStore


def staged(root, table: str, day: str, *channels: str):
    files = []
    for channel in channels:
        folder = root / table / f"day={day}" / f"channel={channel}"
        folder.mkdir(parents=True, exist_ok=True)
        f = folder / "part-00000-x.snappy.parquet"
        f.write_bytes(b"rows")
        files.append((f, root / table))
    return files


def commit(store, work, day, generation, *channels):
    return store.commit(day=day, generation=generation, staged={"jobs": staged(work, "jobs", day, *channels)},
                        finished="age", rows={"jobs": 3}, missing={}, sources={"live": 3})


def test_commit_moves_the_files_in_then_writes_the_marker(tmp_path):
    store = FactsStore(tmp_path / "facts")
    work = store.work_dir("write-1") / "live"
    marker = commit(store, work, "2026-03-01", "g1", "ch-a", "ch-b")
    assert marker.files["jobs"] == ["jobs/day=2026-03-01/channel=ch-a/g1-live-part-00000-x.snappy.parquet",
                                    "jobs/day=2026-03-01/channel=ch-b/g1-live-part-00000-x.snappy.parquet"]
    assert all((store.base / rel).exists() for rel in marker.files["jobs"])
    assert not list((work / "jobs").rglob("*.parquet"))
    assert store.markers()["2026-03-01"].files == marker.files
    assert store.files(store.markers().values(), "jobs") == [store.base / rel for rel in marker.files["jobs"]]
    assert store.base.name == f"v{SCHEMA_VERSION}"


def test_a_rebuild_retires_the_old_generation_and_leftovers_go(tmp_path):
    store = FactsStore(tmp_path / "facts")
    work = store.work_dir("write-1") / "live"
    old = commit(store, work, "2026-03-01", "g1", "ch-a")
    leftover = store.base / "jobs" / "day=2026-03-01" / "channel=ch-a" / "g0-live-part-9.parquet"
    leftover.write_bytes(b"a run that died before its marker")
    new = commit(store, work, "2026-03-01", "g2", "ch-a")
    assert not leftover.exists()
    assert all((store.base / rel).exists() for rel in old.files["jobs"] + new.files["jobs"])
    store.collect_garbage(now=time.time() + GRACE - 60)
    assert (store.base / old.files["jobs"][0]).exists()  # a reader may still be reading it
    store.collect_garbage(now=time.time() + GRACE + 1)
    assert not (store.base / old.files["jobs"][0]).exists() and (store.base / new.files["jobs"][0]).exists()
    assert json.loads((store.base / "retired.json").read_text()) == []

    store.uncommit("2026-03-01")
    assert store.markers() == {} and (store.base / new.files["jobs"][0]).exists()  # retired, not yet gone


def test_staging_of_dead_runs_is_collected(tmp_path):
    store = FactsStore(tmp_path / "facts")
    for run in ("write-dead", "read-old", "read-live", "write-me"):
        store.work_dir(run)
    store.collect_garbage(keep="write-me", now=time.time() + 3600)
    assert sorted(p.name for p in (store.base / "_work").iterdir()) == ["read-live", "read-old", "write-me"]
    store.collect_garbage(keep="write-me", now=time.time() + 2 * 86400)
    assert sorted(p.name for p in (store.base / "_work").iterdir()) == ["write-me"]


def test_markers_of_another_schema_are_ignored(tmp_path):
    store = FactsStore(tmp_path / "facts")
    (store.base / "days").mkdir(parents=True)
    (store.base / "days" / "2026-03-01.json").write_text(json.dumps(
        {"schema": SCHEMA_VERSION + 1, "day": "2026-03-01", "generation": "g"}))
    assert store.markers() == {} and store.markers(["2026-03-01", "2026-03-02"]) == {}
