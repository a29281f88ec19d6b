"""The worker class in gunicorn as users run it (``gunicorn broker.wsgi:application`` with
gunicorn.conf.py): SIGTERM lets the request in flight finish, max_requests restarts the worker, the
access log when BROKER_ACCESS_LOG asks for it, and the heartbeat that keeps an idle worker alive."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

import pytest
import requests

from tests.processes import Proc, _spawn, child_env, free_port, start_web, wait_for
from bench.common import http_ready

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN = {"X-Broker-Admin-Token": "test-admin-token"}
PUBLISH = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "wp", "X-Broker-Producer-Token": "pt",
           "Content-Type": "text/plain"}


def world(url: str) -> None:
    for path, data in (("/channel/wk", {"token": "ct"}), ("/producer/wp", {"token": "pt"}),
                       ("/channel/wk/consumer/pl", {"token": "lt", "type": "pull"})):
        r = requests.put(url + path, data=data, headers=ADMIN, timeout=10)
        assert r.status_code == 200, r.text


def workers(master: int) -> set[int]:
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == master:
                        found.add(int(pid))
            except OSError:
                pass
    return found


def test_sigterm_lets_a_long_poll_finish_and_the_worker_exit(tmp_path):
    web = start_web(tmp_path, workers=1, BROKER_ADMIN_TOKEN="test-admin-token")
    try:
        world(web.url)
        answer = {}

        def long_poll():
            answer["r"] = requests.post(f"{web.url}/channel/wk/consumer/pl/pull", json={"expires": 3},
                                        headers={"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "lt"},
                                        timeout=30)

        poll = threading.Thread(target=long_poll)
        poll.start()
        time.sleep(1.0)
        began = time.monotonic()
        os.kill(web.pid, signal.SIGTERM)
        poll.join(30)
        assert answer["r"].status_code == 200 and answer["r"].json() == {"Result": []}
        web.popen.wait(30)
        assert web.popen.returncode == 0 and time.monotonic() - began < 10, web.output()[-2000:]
    finally:
        web.stop()


def test_max_requests_restarts_the_worker_and_nothing_is_refused(tmp_path):
    web = start_web(tmp_path, workers=1, BROKER_ADMIN_TOKEN="test-admin-token", BROKER_WEB_MAX_REQUESTS=20)
    try:
        world(web.url)
        first = workers(web.pid)
        codes = []
        with requests.Session() as s:
            for i in range(60):
                for attempt in range(3):  # a connection the old worker closed after its last answer
                    try:
                        codes.append(s.post(f"{web.url}/channel/wk/broadcast", data=b"x", headers=PUBLISH,
                                            timeout=10).status_code)
                        break
                    except requests.ConnectionError:
                        time.sleep(0.2)
        assert codes == [201] * 60
        assert wait_for(lambda: workers(web.pid) and not workers(web.pid) & first, 20), web.output()[-2000:]
        assert "Autorestarting worker" in web.output()
    finally:
        web.stop()


def test_the_access_log_when_asked_for(tmp_path):
    """(its lines go through the broker's logging configuration, gunicorn.conf.py: the console)"""
    web = start_web(tmp_path, workers=1, BROKER_ADMIN_TOKEN="test-admin-token", BROKER_ACCESS_LOG="-")
    try:
        world(web.url)
        assert requests.post(f"{web.url}/channel/wk/broadcast", data=b"x", headers=PUBLISH, timeout=10).status_code == 201
        assert requests.get(f"{web.url}/_status", timeout=10).status_code == 200
        assert wait_for(lambda: "GET /_status" in web.output(), 10)
        lines = web.output().splitlines()
        assert any("POST /channel/wk/broadcast HTTP/1.1" in line and " 201 " in line for line in lines), lines
        assert any("GET /_status HTTP/1.1" in line and " 200 " in line for line in lines), lines
    finally:
        web.stop()
    quiet = start_web(tmp_path, workers=1)
    try:
        assert requests.get(f"{quiet.url}/_status", timeout=10).status_code == 200
        time.sleep(0.5)
        assert "/_status" not in quiet.output()
    finally:
        quiet.stop()


def test_an_idle_worker_tells_the_master_it_is_alive(tmp_path):
    """gunicorn kills a worker silent for ``timeout`` seconds: the event loop's heartbeat keeps an
    idle one alive (here with a 3 s timeout, watched for 8 s)."""
    port = free_port()
    log = tmp_path / "web.log"
    popen = _spawn([sys.executable, "-m", "gunicorn", "broker.wsgi:application", "--timeout", "3"],
                   child_env(BROKER_BIND=f"127.0.0.1:{port}", BROKER_WEB_WORKERS=1), log)
    web = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        http_ready(popen, web.url, web.output, timeout=30, name="gunicorn")
        first = workers(web.pid)
        time.sleep(8)
        assert workers(web.pid) == first, web.output()[-2000:]
        assert requests.get(f"{web.url}/_status", timeout=10).status_code == 200
        assert "WORKER TIMEOUT" not in web.output()
    finally:
        web.stop()


@pytest.mark.parametrize("freeze", ["1", "0"])
def test_a_worker_freezes_what_it_loaded_out_of_the_collector_s_full_passes(tmp_path, freeze):
    """broker.heap: a full collection walked ~150,000 objects a worker keeps for its life and
    stalled its event loop 0.13-0.35 s at an overload; frozen once loaded (BROKER_GC_FREEZE)."""
    web = start_web(tmp_path, workers=1, BROKER_ADMIN_TOKEN="test-admin-token", BROKER_GC_FREEZE=freeze)
    try:
        world(web.url)
        answer = requests.post(f"{web.url}/channel/wk/broadcast", data=b"x", headers=PUBLISH, timeout=10)
        assert answer.status_code == 201, answer.text
        lines = [line for line in web.output().splitlines() if "frozen out of the garbage collector" in line]
        if freeze == "1":
            assert len(lines) == 1, web.output()[-2000:]
            assert int(re.search(r"(\d+) objects frozen", lines[0]).group(1)) > 50_000, lines
        else:
            assert lines == [], lines
    finally:
        web.stop()
