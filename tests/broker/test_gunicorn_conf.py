"""gunicorn.conf.py: every broker instance has its own control socket under BROKER_DATA_DIR (or
none), so two brokers on one host never delete each other's."""

from __future__ import annotations

import stat
import time

import pytest

from tests.processes import start_web, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def sockets(folder) -> set[str]:
    run = folder / "run"
    if not run.exists():
        return set()
    return {p.name for p in run.iterdir() if stat.S_ISSOCK(p.stat().st_mode)}


def test_two_instances_keep_their_own_control_sockets(tmp_path, short_tmp):
    data, home = short_tmp / "data", short_tmp / "home"  # (a deeper folder gets no socket: gunicorn.conf.py)
    home.mkdir()
    env = {"BROKER_DATA_DIR": data, "HOME": home, "XDG_RUNTIME_DIR": ""}
    one = start_web(tmp_path, **env)
    two = start_web(tmp_path, **env)
    try:
        names = {f"gunicorn-{web.url.removeprefix('http://').replace(':', '-')}.ctl" for web in (one, two)}
        assert wait_for(lambda: sockets(data) == names), (sockets(data), one.output()[-1500:])
        assert not (home / ".gunicorn").exists(), "nothing in the per-user default place"
        one.stop()
        assert wait_for(lambda: sockets(data) == names - {f"gunicorn-{one.url[7:].replace(':', '-')}.ctl"})
        assert two.popen.poll() is None, "the other instance and its socket are untouched"
    finally:
        one.stop()
        two.stop()


def test_control_socket_path_or_off(tmp_path):
    data = tmp_path / "data"
    path = tmp_path / "ctl" / "mine.ctl"
    chosen = start_web(tmp_path, BROKER_DATA_DIR=data, BROKER_GUNICORN_CONTROL_SOCKET=path)
    try:
        assert wait_for(lambda: path.exists() and stat.S_ISSOCK(path.stat().st_mode)), chosen.output()[-1500:]
    finally:
        chosen.stop()
    off = start_web(tmp_path, BROKER_DATA_DIR=data, BROKER_GUNICORN_CONTROL_SOCKET="off", HOME=tmp_path,
                    XDG_RUNTIME_DIR="")
    try:
        time.sleep(1.0)  # (the socket would be up by now)
        assert off.popen.poll() is None and sockets(data) == set() and not (tmp_path / ".gunicorn").exists()
    finally:
        off.stop()
