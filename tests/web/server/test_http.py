"""The web server's HTTP/1.1 (web.server.http, web.server.wsgi) with a plain WSGI application:
keep-alive, pipelining in order, request bodies as they stream (chunked, 100-continue, unread ones),
HEAD, streamed answers, limits and timeouts, the scheme from trusted proxies, a client that went
away, graceful shutdown. Real sockets on loopback; no database."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.web.server.conftest import Reader
from web.server.http import Limits


def echo(environ, start_response):
    """Answers what it got: method, path, query, body and a few environ keys, as JSON."""
    body = environ["wsgi.input"].read()
    if environ["PATH_INFO"] == "/slow":
        time.sleep(0.3)
    data = {"method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"], "query": environ["QUERY_STRING"],
            "body": body.decode("latin-1"), "length": environ.get("CONTENT_LENGTH"),
            "scheme": environ["wsgi.url_scheme"],
            "headers": {k: v for k, v in environ.items() if k.startswith("HTTP_")}}
    out = json.dumps(data).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def request(method: str, path: str, body: bytes = b"", headers: dict | None = None, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: test"]
    headers = dict(headers or {})
    if body and "Transfer-Encoding" not in headers:
        headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def test_keep_alive_and_pipelined_requests_are_answered_in_order(serve):
    served = serve(echo)
    sock = served.connect()
    reader = Reader(sock)
    sock.sendall(request("POST", "/one", b"a") + request("GET", "/slow?x=1") + request("POST", "/three", b"ccc"))
    answers = [reader.response() for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 200]
    assert [json.loads(a.body)["path"] for a in answers] == ["/one", "/slow", "/three"]  # the slow one did not let /three pass
    assert json.loads(answers[1].body)["query"] == "x=1" and json.loads(answers[2].body)["body"] == "ccc"
    assert all(a.header("Date") for a in answers) and not any(a.header("Connection") for a in answers)
    sock.sendall(request("GET", "/again"))
    assert reader.response().status == 200  # the same connection goes on
    sock.close()


def test_a_chunked_request_body_reaches_the_application_whole_with_its_length(serve):
    served = serve(echo)
    sock = served.connect()
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    sock.sendall(request("POST", "/c", body, {"Transfer-Encoding": "chunked"}))
    got = json.loads(Reader(sock).response().body)
    assert (got["body"], got["length"]) == ("hello world", "11")


def test_100_continue_is_sent_when_the_application_reads_the_body(serve):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(request("POST", "/e", b"", {"Content-Length": "4", "Expect": "100-continue"}))
    reader = Reader(sock)
    assert reader.response().status == 100
    sock.sendall(b"data")
    assert json.loads(reader.response().body)["body"] == "data"


def refuse_unread(environ, start_response):
    """Answers 401 without reading the body (as the broker does when the credentials fail)."""
    start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"no"]


def test_a_body_the_application_does_not_read_is_not_asked_for_nor_read(serve):
    served = serve(refuse_unread)
    sock = served.connect()
    reader = Reader(sock)
    # 100-continue: the refusal comes without "100 Continue", the body is never sent, the connection ends
    sock.sendall(request("POST", "/x", b"", {"Content-Length": "4000000", "Expect": "100-continue"}))
    answer = reader.response()
    assert answer.status == 401 and answer.header("Connection") == "close" and reader.closed()
    # a large body sent anyway: answered before it is all in, the connection closed (not read to its end)
    sock = served.connect()
    reader = Reader(sock)
    sock.sendall(request("POST", "/x", b"", {"Content-Length": str(64 << 20)}) + b"x" * (1 << 20))
    assert reader.response().status == 401
    assert reader.closed()
    # a small unread body is skipped and the connection goes on
    sock = served.connect()
    reader = Reader(sock)
    sock.sendall(request("POST", "/x", b"tiny") + request("POST", "/y", b"tiny"))
    assert [reader.response().status, reader.response().status] == [401, 401]


def test_head_has_the_headers_and_no_body(serve):
    served = serve(echo)
    sock = served.connect()
    reader = Reader(sock)
    sock.sendall(request("HEAD", "/h") + request("GET", "/g"))
    head = reader.response(head=True)
    assert head.status == 200 and int(head.header("Content-Length")) > 0
    assert json.loads(reader.response().body)["path"] == "/g"  # nothing of the HEAD's body came between


def streamed(environ, start_response):
    size = int(environ["QUERY_STRING"] or "3")
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    for i in range(size):
        yield bytes([65 + i % 26]) * 100_000


def test_a_streamed_answer_without_length_is_chunked_and_arrives_whole_at_a_slow_reader(serve):
    served = serve(streamed)
    sock = served.connect()
    sock.sendall(request("GET", "/s?3"))
    answer = Reader(sock).response()
    assert answer.header("Transfer-Encoding") == "chunked" and len(answer.body) == 300_000
    sock.close()
    sock = served.connect()  # 20 MB to a reader that waits first: the thread waits for room, nothing is lost
    sock.sendall(request("GET", "/s?200"))
    time.sleep(1.0)
    answer = Reader(sock).response()
    assert len(answer.body) == 20_000_000 and answer.body[-1:] == bytes([65 + 199 % 26])


def test_http_1_0_closes_unless_asked_to_keep_alive(serve):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(request("GET", "/a", version="1.0"))
    reader = Reader(sock)
    assert reader.response().status == 200 and reader.closed()
    sock = served.connect()
    sock.sendall(request("GET", "/a", headers={"Connection": "keep-alive"}, version="1.0"))
    reader = Reader(sock)
    assert reader.response().header("Connection") == "keep-alive" and not reader.closed(0.3)


@pytest.mark.parametrize("raw,status", [
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 9000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nExpect: something\r\nContent-Length: 1\r\n\r\nx", 417),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
])
def test_requests_the_server_refuses(serve, raw, status):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(raw)
    reader = Reader(sock)
    answer = reader.response()
    assert answer.status == status and answer.header("Connection") == "close"
    assert reader.closed()


def test_a_refused_request_after_a_good_one_is_answered_in_its_turn(serve):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(request("GET", "/slow") + b"GARBAGE\r\n\r\n")
    reader = Reader(sock)
    assert reader.response().status == 200 and reader.response().status == 400 and reader.closed()


def test_header_names_with_underscores_are_dropped_and_repeated_headers_joined(serve):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX_A: spoof\r\nX-B: 1\r\nX-B: 2\r\n\r\n")
    headers = json.loads(Reader(sock).response().body)["headers"]
    assert headers["HTTP_X_A"] == "1" and headers["HTTP_X_B"] == "1,2"


def test_the_scheme_header_counts_only_from_a_trusted_peer(serve):
    proto = {"X-Forwarded-Proto": "https"}
    trusted = serve(echo, scheme_headers={"X-FORWARDED-PROTO": "https"}, forwarded=lambda ip: ip == "127.0.0.1")
    sock = trusted.connect()
    sock.sendall(request("GET", "/", headers=proto))
    assert json.loads(Reader(sock).response().body)["scheme"] == "https"
    untrusted = serve(echo, scheme_headers={"X-FORWARDED-PROTO": "https"}, forwarded=lambda ip: False)
    sock = untrusted.connect()
    sock.sendall(request("GET", "/", headers=proto))
    assert json.loads(Reader(sock).response().body)["scheme"] == "http"


def test_idle_connections_and_slow_heads_time_out(serve):
    served = serve(echo, limits=Limits(keepalive=0.5, header=0.5))
    sock = served.connect()
    sock.sendall(request("GET", "/"))
    reader = Reader(sock)
    assert reader.response().status == 200
    began = time.monotonic()
    assert reader.closed(5) and time.monotonic() - began < 2.0  # idle keep-alive: closed
    sock = served.connect()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    reader = Reader(sock)
    assert reader.response().status == 408 and reader.closed()


def test_a_body_that_stops_arriving_fails_its_reader(serve):
    seen = []

    def reads(environ, start_response):
        try:
            environ["wsgi.input"].read()
        except OSError as exc:
            seen.append(exc)
            raise
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    served = serve(reads, limits=Limits(body=0.5))
    sock = served.connect()
    sock.sendall(request("POST", "/", b"", {"Content-Length": "10"}) + b"12345")
    assert Reader(sock).closed(5) and seen and "timed out" in str(seen[0])


def test_application_errors_answer_500(serve):
    def broken(environ, start_response):
        raise RuntimeError("boom")

    served = serve(broken)
    sock = served.connect()
    sock.sendall(request("GET", "/") + request("GET", "/"))
    reader = Reader(sock)
    assert [reader.response().status, reader.response().status] == [500, 500]


def test_a_long_poll_sees_its_client_go(serve):
    """``broker.client_gone``: the peer closed, or half-closed, its side (web.api.pull.handlers)."""
    seen: list[tuple[str, float]] = []

    def waits(environ, start_response):
        gone = environ["broker.client_gone"]
        began = time.monotonic()
        while not gone() and time.monotonic() - began < 5:
            time.sleep(0.02)
        seen.append((environ["PATH_INFO"], time.monotonic() - began))
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    served = serve(waits)
    sock = served.connect()
    sock.sendall(request("GET", "/closed"))
    time.sleep(0.2)
    sock.close()
    sock = served.connect()
    sock.sendall(request("GET", "/half-closed"))
    time.sleep(0.2)
    sock.shutdown(socket.SHUT_WR)
    assert Reader(sock).response().status == 200  # a half-closed client still gets its answer
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(path for path, _ in seen) == ["/closed", "/half-closed"]
    assert all(took < 1.0 for _, took in seen), seen


def test_graceful_shutdown_finishes_the_request_in_flight(serve):
    release = threading.Event()

    def held(environ, start_response):
        release.wait(5)
        start_response("200 OK", [("Content-Length", "4")])
        return [b"done"]

    served = serve(held)
    busy = served.connect()
    busy.sendall(request("GET", "/"))
    idle = served.connect()
    time.sleep(0.2)
    stopping = threading.Thread(target=served.shutdown, args=(5.0,))
    stopping.start()
    time.sleep(0.3)
    assert Reader(idle).closed(2)  # an idle connection is closed at once
    with pytest.raises(ConnectionRefusedError):
        served.connect(timeout=1)  # no new ones
    release.set()
    answer = Reader(busy).response()
    assert answer.body == b"done" and answer.header("Connection") == "close"
    stopping.join(10)


def test_graceful_shutdown_still_reads_the_body_of_the_request_in_flight(serve):
    served = serve(echo)
    sock = served.connect()
    sock.sendall(request("POST", "/late", b"", {"Content-Length": "4"}))  # the head; its body comes later
    time.sleep(0.2)
    stopping = threading.Thread(target=served.shutdown, args=(5.0,))
    stopping.start()
    time.sleep(0.3)
    sock.sendall(b"body")
    answer = Reader(sock).response()
    assert json.loads(answer.body)["body"] == "body" and answer.header("Connection") == "close"
    stopping.join(10)


def test_the_clock_ticks_once_a_second_while_idle_and_four_times_while_answering(serve):
    """An idle worker wakes once a second (its share of an idle broker's CPU), not four times; a
    request ends the idle pause at once, and while it is answered the clock (timeouts, the loop's
    lag that admission reads) ticks at TICK."""
    from web.server.http import TICK, TICK_IDLE

    def slow(environ, start_response):
        time.sleep(2.0)
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    served = serve(slow)
    ticks: list[float] = []
    served.call(served.server.tick_hooks.append, ticks.append)
    time.sleep(TICK_IDLE + 0.5)  # the first pause may still be TICK
    idle_from = len(ticks)
    time.sleep(3.0)
    idle = len(ticks) - idle_from
    assert 1 <= idle <= 4  # about 3 (12 at TICK)
    sock = served.connect()
    sent = time.monotonic()
    sock.sendall(request("GET", "/"))
    time.sleep(0.3)
    # the request ends the idle pause: the clock ticks at once, not up to TICK_IDLE later
    assert [t for t in ticks if t >= sent][:1] and min(t for t in ticks if t >= sent) - sent < 0.15, (sent, ticks[-4:])
    busy_from = len(ticks)
    time.sleep(0.8)
    busy = len(ticks) - busy_from
    assert Reader(sock).response().status == 200
    assert busy >= 2 and TICK < TICK_IDLE  # about 3 in 0.8 s while the request runs
