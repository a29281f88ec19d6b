"""A qcluster worker freezes what it loaded out of the garbage collector's full passes as it spawns
(broker.heap, BROKER_GC_FREEZE), as the web workers do: a dispatcher loop's process keeps Django
and the tasks for its life, and every full pass of the collector would walk them all again."""

from __future__ import annotations

import re
import time

import pytest

from tests.processes import start_qcluster

FROZEN = re.compile(r"(\d+) objects frozen out of the garbage collector")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("freeze", ["1", "0"])
def test_each_worker_freezes_its_heap_as_it_spawns(tmp_path, freeze):
    cluster = start_qcluster(tmp_path, BROKER_Q_WORKERS="2", BROKER_LOG_FORMAT="plain", BROKER_GC_FREEZE=freeze)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = cluster.output()
            if text.count("ready for work") >= 2 and (freeze == "0" or len(FROZEN.findall(text)) >= 2):
                break
            time.sleep(0.3)
        time.sleep(1.0 if freeze == "0" else 0.0)  # (a freeze is logged right after "ready for work")
        text = cluster.output()
        assert text.count("ready for work") >= 2, text[-3000:]
        counts = [int(n) for n in FROZEN.findall(text)]
        if freeze == "1":
            assert len(counts) == 2, text[-3000:]  # one per worker, once
            assert min(counts) > 50_000, counts
        else:
            assert counts == [], text[-3000:]
    finally:
        cluster.stop()
