"""The callback HTTP client (jobs.callbacks.http) against raw socket servers on 127.0.0.1 that answer
exactly the bytes a test scripts: framing variants, interim answers, oversize and broken answers,
connections closed by the server, timeouts, TLS verification."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from jobs.callbacks.http import MAX_BODY, Client, ProtocolError
from tests.helpers import LoopbackServer
from tests.jobs.callbacks.rawhttp import request_read


class RawServer(LoopbackServer):
    """Reads one request at a time per connection; ``script(n, request_bytes) -> (reply_bytes, close)``."""

    def __init__(self, script, tls: ssl.SSLContext | None = None):
        self.script = script
        self.requests: list[bytes] = []
        self.tls = tls
        super().__init__()

    def serve(self, conn):
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()
                return
        buf = b""
        try:
            while (read := request_read(conn, buf)) is not None:
                request, buf = read
                self.requests.append(request)
                reply, close = self.script(len(self.requests), self.requests[-1])
                if reply:
                    conn.sendall(reply)
                if close:
                    conn.close()
                    return
        except OSError:
            pass
        conn.close()


@pytest.fixture
def client():
    c = Client()
    yield c
    c.stop()


def post(client, port, *, scheme="http", timeout=5.0, body=b'{"a": 1}', host="127.0.0.1", path="/cb"):
    future = asyncio.run_coroutine_threadsafe(
        client.post(scheme=scheme, host=host, port=port, path=path, headers={"X-Test": "1"}, body=body,
                    timeout=timeout), client.loop)
    return future.result(timeout + 5)


def test_content_length_answer_and_keep_alive(client):
    server = RawServer(lambda n, r: (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello", False))
    for _ in range(3):
        answer = post(client, server.port)
        assert (answer.status, answer.body, answer.headers["x-a"]) == (200, b"hello", "b")
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /cb HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:%d\r\n" % server.port in first and b"\r\nX-Test: 1\r\n" in first
    assert first.endswith(b'\r\n\r\n{"a": 1}')


def test_chunked_answer_with_trailer(client):
    reply = (b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"4;ext=1\r\nboom\r\n6\r\n-again\r\n0\r\nX-Trailer: 1\r\n\r\n")
    server = RawServer(lambda n, r: (reply, False))
    answer = post(client, server.port)
    assert (answer.status, answer.body) == (500, b"boom-again")
    assert post(client, server.port).body == b"boom-again"
    assert server.connections == 1  # reusable after a complete chunked answer


def test_close_delimited_and_http10_answers_are_not_reused(client):
    server = RawServer(lambda n, r: (b"HTTP/1.0 202 Accepted\r\n\r\nuntil close", True))
    for _ in range(2):
        answer = post(client, server.port)
        assert (answer.status, answer.body) == (202, b"until close")
    assert server.connections == 2
    closing = RawServer(lambda n, r: (b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", False))
    post(client, closing.port)
    post(client, closing.port)
    assert closing.connections == 2


def test_interim_1xx_answers_are_skipped(client):
    server = RawServer(lambda n, r: (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n"
                                     b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", False))
    answer = post(client, server.port)
    assert (answer.status, answer.body) == (201, b"ok")


def test_oversize_body_is_cut_and_the_connection_dropped(client):
    big = b"x" * (MAX_BODY * 3)
    server = RawServer(lambda n, r: (b"HTTP/1.1 400 Bad\r\nContent-Length: %d\r\n\r\n" % len(big) + big, False))
    answer = post(client, server.port)
    assert answer.status == 400 and len(answer.body) == MAX_BODY
    post(client, server.port)
    assert server.connections == 2


def test_a_connection_the_server_closed_while_idle_is_replaced(client):
    # The first answer says keep-alive, then the server closes anyway (as idle timeouts do).
    server = RawServer(lambda n, r: (b"HTTP/1.1 204 No Content\r\n\r\n", True))
    assert post(client, server.port).status == 204
    time.sleep(0.2)
    assert post(client, server.port).status == 204
    assert len(server.requests) == 2 and server.connections == 2


def test_closed_before_answering_and_garbage_are_errors(client):
    silent = RawServer(lambda n, r: (b"", True))
    with pytest.raises(ConnectionResetError):
        post(client, silent.port)
    garbage = RawServer(lambda n, r: (b"SMTP ready\r\n\r\n", False))
    with pytest.raises(ProtocolError):
        post(client, garbage.port)
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    with pytest.raises(OSError):
        post(client, port)


def test_total_deadline_covers_a_slow_drip(client):
    def drip(n, request):
        return b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x", False  # never finishes

    server = RawServer(drip)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        post(client, server.port, timeout=0.5)
    assert time.monotonic() - start < 3


def _concurrently(client, port, n: int, *, timeout: float) -> list:
    """``n`` POSTs started at once on the client's loop; their answers or exceptions, in order."""
    async def one():
        return await client.post(scheme="http", host="127.0.0.1", port=port, path="/cb", headers={}, body=b"x",
                                 timeout=timeout)

    async def all_of():
        return await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(all_of(), client.loop)


def test_new_connections_to_one_endpoint_are_paced_and_the_rest_wait_for_them():
    """Eight callbacks at once to an endpoint that never answers: two connections at once, then two a
    second (each request waits, without CPU, inside its own deadline: those that got none time out)."""
    server = RawServer(lambda n, r: (b"", False))  # reads, never answers
    client = Client(connect_rate=2.0, connect_burst=2)
    try:
        started = time.monotonic()
        future = _concurrently(client, server.port, 8, timeout=1.6)
        key = ("http", "127.0.0.1", server.port)
        while not future.done():
            opened = client.connects[key]
            assert opened <= 2 + 2.0 * (time.monotonic() - started) + 1, opened
            time.sleep(0.02)
        results = future.result()
        assert all(isinstance(r, TimeoutError) for r in results), results
        assert 4 <= client.connects[key] <= 6  # 2 at once + 2 a second over 1.6 s (give or take a tick)
    finally:
        client.stop()


def test_a_request_waiting_for_a_connection_takes_one_given_back():
    """One token for five callbacks to an endpoint that answers: the four others take the connection
    as it comes back (keep-alive), without waiting for tokens."""
    server = RawServer(lambda n, r: (b"HTTP/1.1 204 No Content\r\n\r\n", False))
    client = Client(connect_rate=0.1, connect_burst=1)  # a second token would take 10 s
    try:
        results = _concurrently(client, server.port, 5, timeout=5.0).result(8)
        assert [r.status for r in results] == [204] * 5
        assert server.connections == 1 and len(server.requests) == 5
    finally:
        client.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_certificates_are_verified(client, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = RawServer(lambda n, r: (b"HTTP/1.1 204 No Content\r\n\r\n", False), tls=tls)
    with pytest.raises(ssl.SSLCertVerificationError):
        post(client, server.port, scheme="https", host="localhost")
    assert server.requests == []  # nothing was sent to an unverified server
