"""broker.embedded_db: the embedded server starts under any data directory a user picks."""

from __future__ import annotations

import psycopg

from broker import embedded_db


def test_a_deep_data_directory_gets_a_server_on_tcp_only(tmp_path):
    """A socket's path ends at 107 bytes (AF_UNIX): under a deeper BROKER_DATA_DIR the server used
    to refuse to start (``could not create any Unix-domain sockets``); it now listens on TCP only."""
    base = tmp_path / ("d" * 60) / ("e" * 40) / "postgres"
    assert len(str(base / "pgdata" / ".s.PGSQL.65535")) > 107
    server = embedded_db.server_ensure(base, fsync=False, database="deep")
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user=embedded_db.DB_USER, dbname="deep",
                             connect_timeout=10) as conn:
            assert conn.execute("SELECT current_setting('unix_socket_directories')").fetchone() == ("",)
    finally:
        assert embedded_db.server_stop(base)
