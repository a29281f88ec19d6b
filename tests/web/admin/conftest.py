"""Fixtures for the admin tests: a broker with jobs in every state, and the browser for e2e tests.

Jobs are created by publishing through the HTTP API and moved through the status writers (never by
writing their status), so the counters and the per-minute statistics are the real ones.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from jobs.models import Job, JobStatus
from jobs.pull.claim import jobs_claim
from jobs.state.transitions import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.jobs.moves import Move, jobs_move
from tests.processes import ROOT

# Playwright's sync API runs an event loop in this thread; Django would refuse its ORM calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """pytest-playwright: Debian's chromium, never a downloaded browser."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def chromium_missing() -> bool:
    return not (Path(CHROMIUM).exists() or shutil.which("chromium"))


def queued_ids(consumer_id: str, n: int | None = None) -> list[int]:
    ids = list(Job.objects.filter(consumer__consumer_id=consumer_id, status=JobStatus.QUEUED)
               .order_by("id").values_list("id", flat=True))
    return ids if n is None else ids[:n]


def consumer_pk(consumer_id: str) -> int:
    from consumers.models import Consumer

    return Consumer.objects.get(consumer_id=consumer_id).pk


def finish(consumer_id: str, n: int, to_status: int) -> list[int]:
    """Claim n queued jobs of the consumer and end their attempt in ``to_status`` (QUEUED = failed,
    retried), through the state machine. Returns the job ids."""
    claimed = jobs_claim(consumer_pk=consumer_pk(consumer_id), limit=n)
    assert len(claimed) == n, (consumer_id, n, len(claimed))
    moves = [Move(job_id=j.id, from_status=INFLIGHT, to_status=to_status,
                        retry_inc=1 if to_status == QUEUED else 0,
                        delay=0 if to_status == QUEUED else None)
             for j in claimed]
    assert len(jobs_move(moves=moves, reason="test")) == n
    return [j.id for j in claimed]


@pytest.fixture
def broker(world):
    """ch1 with push consumer c1 and pull consumer c2, 10 published messages (m00..m09):
    c1: 3 delivered, 2 dead, 1 in flight, 4 queued; c2: 10 queued."""
    for i in range(10):
        r = world.publish(body=f'{{"n": {i}, "hello": "world"}}'.encode(), HTTP_X_BROKER_MESSAGE_ID=f"m{i:02d}")
        assert r.status_code == 201, r.content
    finish("c1", 3, DELIVERED)
    finish("c1", 2, DEAD)
    claimed = jobs_claim(consumer_pk=consumer_pk("c1"), limit=1)
    assert len(claimed) == 1
    return world


def dead_ids(consumer_id: str = "c1") -> list[int]:
    return list(Job.objects.filter(consumer__consumer_id=consumer_id, status=JobStatus.DEAD)
                .order_by("id").values_list("id", flat=True))
