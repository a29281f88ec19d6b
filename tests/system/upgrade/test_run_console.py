"""What an operator sees: ``make run`` (``manage.py runbroker``) speaks one log format, gunicorn's own
lines included (plain there, a JSON object per line in production), and Ctrl-C stops everything it
started; its last line says that the embedded PostgreSQL keeps running and how to stop it, and that
command stops it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import requests

from tests.helpers import wait_until
from tests.processes import ROOT, free_port, start_web

PLAIN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.-]+ ")


def _status(port: int) -> int | None:
    """The status of ``GET /_status``; None while nothing listens."""
    try:
        return requests.get(f"http://127.0.0.1:{port}/_status", timeout=5).status_code
    except requests.ConnectionError:
        return None


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of the running processes whose environment carries ``mark``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"BROKER_TEST_RUN={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append((int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def test_make_run_console_and_ctrl_c(tmp_path):
    mark, port = uuid.uuid4().hex, free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "BROKER_LOG_FORMAT", "PYTEST_CURRENT_TEST", "BROKER_TESTING")}
    env.update(BROKER_DATA_DIR=str(tmp_path / "data"), DJANGO_SECRET_KEY="console-test", PYTHONUNBUFFERED="1",
               BROKER_TEST_RUN=mark, BROKER_Q_WORKERS="2", BROKER_GUNICORN_CONTROL_SOCKET="off")
    run = subprocess.Popen([sys.executable, "manage.py", "runbroker", "--bind", f"127.0.0.1:{port}"], cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("Q Cluster" in l and "running" in l for l in lines):
            assert run.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.2)
        wait_until(lambda: _status(port) == 200, timeout=60, what="the web server answers /_status",
                   detail=lambda: "".join(lines)[-3000:])  # (it may bind after the cluster's line)
        time.sleep(1.0)
        run.send_signal(signal.SIGINT)  # what Ctrl-C sends (the children run in sessions of their own)
        assert run.wait(timeout=30) == 0, "".join(lines)[-3000:]
        reader.join(timeout=10)
        left = [p for p in _marked(mark) if "postgres" not in p[1]]
        assert not left, f"still running after Ctrl-C: {left}"

        text = [l.rstrip("\n") for l in lines if l.strip()]
        banner = next(i for i, l in enumerate(text) if l.startswith("broker on http://"))
        logged = text[banner + 5:-1]  # after the banner's five lines, before the last line
        assert [l for l in logged if not PLAIN.match(l)] == [], "\n".join(text)
        assert any(" gunicorn.error " in l for l in logged) and any(" django-q " in l for l in logged), logged
        last = text[-1]
        stop = re.search(r"the embedded PostgreSQL keeps running \(.+\); stop it with: (\S+ -m broker\.embedded_db stop)$",
                         last)
        assert last.startswith("broker stopped") and stop, last
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for pid, _ in [p for p in _marked(mark) if "postgres" not in p[1]]:
            os.kill(pid, signal.SIGKILL)
        stopped = subprocess.run(f"{sys.executable} -m broker.embedded_db stop".split(), cwd=ROOT, env=env,
                                 capture_output=True, text=True)
    assert stopped.stdout.strip() == "stopped", stopped  # the last line's command stops the server
    assert _marked(mark) == []


def test_production_gunicorn_lines_are_json(tmp_path):
    assert "BROKER_LOG_FORMAT" not in os.environ
    web = start_web(tmp_path)  # the default outside debug: JSON
    requests.get(f"{web.url}/_status", timeout=5)
    web.stop()
    lines = [l for l in web.output().splitlines() if l.strip()]
    entries = [json.loads(l) for l in lines]  # every line is one JSON object
    assert any(e["logger"] == "gunicorn.error" and "Booting worker" in e["message"] for e in entries), lines
    assert not any(e["logger"] == "gunicorn.access" for e in entries), "no access log unless BROKER_ACCESS_LOG"
